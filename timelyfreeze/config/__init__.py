"""The ``[freeze]`` section and the checks of the TorchTitan job around it.

TOMLs name this package as TorchTitan's ``[job] custom_config_module = "timelyfreeze.config"``: TorchTitan
imports it and reads its ``JobConfig``, which lives in :mod:`timelyfreeze.config.freeze`. It is looked up on
first use (PEP 562) rather than imported here: the methods declare their own sections next to their code
and check them with :mod:`timelyfreeze.job.fields`, so importing ``freeze`` from this package's
``__init__`` would make every method's import go round through itself.
"""

__all__ = ["JobConfig"]


def __getattr__(name: str):
    if name == "JobConfig":
        from timelyfreeze.config.freeze import JobConfig

        return JobConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
