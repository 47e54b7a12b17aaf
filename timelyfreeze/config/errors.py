"""The error of a setting that cannot work."""


class FreezeConfigError(ValueError):
    """A ``[freeze]`` (or other section's) setting that cannot work; the message names the field."""
