"""The ``[freeze]`` section and the checks of the TorchTitan job around it.

TOMLs name this package as TorchTitan's ``[job] custom_config_module = "timelyfreeze.config"``: TorchTitan
imports it and merges its ``JobConfig`` into its own. The section's dataclasses live in
:mod:`timelyfreeze.config.freeze`.
"""

from timelyfreeze.config.freeze import JobConfig

__all__ = ["JobConfig"]
