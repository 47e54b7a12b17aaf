"""The errors of bad input: a setting that cannot work, and a saved freezing state that cannot be restored.
Each message is the one ``error:`` line a user sees."""


class FreezeConfigError(ValueError):
    """A ``[freeze]`` (or other section's) setting that cannot work; the message names the field."""


class FreezeStateError(ValueError):
    """A saved freezing state that cannot be restored; the message says what is wrong."""
