"""``--help`` for the trainer: TorchTitan's own help, with the old ``[freeze]`` names left out.

TorchTitan's ``ConfigManager`` prints the help from the job config class it builds (its ``JobConfig`` merged
with ``custom_config_module``). :class:`HelpConfigManager` builds the same class and hides the deprecated
names in it (``timelyfreeze.config.deprecated.without_old_names``); a run never uses it, so the old names
still parse there.
"""

from __future__ import annotations

import sys
from typing import Any

from torchtitan.config import ConfigManager

from timelyfreeze.config.deprecated import without_old_names

HELP_FLAGS = ("-h", "--help")


def wants_help(args: list[str]) -> bool:
    """``args`` ask for the help text."""
    return any(a in HELP_FLAGS for a in args)


class HelpConfigManager(ConfigManager):
    """TorchTitan's config manager whose job config class has the old ``[freeze]`` names hidden."""

    def _maybe_add_custom_config(self, args: list[str], toml_values: dict[str, Any] | None) -> type:
        return without_old_names(super()._maybe_add_custom_config(args, toml_values))


def print_help(args: list[str]) -> None:
    """Print the trainer's help for ``args`` (which hold ``-h`` or ``--help``) and exit 0, as tyro does."""
    HelpConfigManager().parse_args(args)
    sys.exit(0)  # tyro exits after printing; this is reached only if it did not
