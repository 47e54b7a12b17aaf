"""Old ``[freeze]`` names, kept working for one release: each moved to its own section, and a run that
still uses one gets one ``warning:`` line naming the new place.

The tuning knobs moved to ``[freeze.advanced]`` and the two settings that are not about freezing to
``[experiment]`` (:data:`RENAMED`, their one list). :func:`names_base` makes a dataclass of the old names with
the types and defaults of their new homes, which ``Freeze`` inherits, so a TOML key or a command-line flag
(``--freeze.solver whole``, ``--freeze.no-gap-model``) under an old name still parses; :func:`apply_renames`
then moves every old name that differs from its default to its new home before anything reads the
configuration. An old name set to its default moves nothing: the run is the same either way.
:func:`without_old_names` hides them from ``--help``, which lists each setting once, in its new home.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from timelyfreeze.job.errors import FreezeConfigError

RENAMED: dict[str, str] = {
    "solver": "freeze.advanced",
    "estimator": "freeze.advanced",
    "gap_model": "freeze.advanced",
    "jitter_model": "freeze.advanced",
    "anchor_monitoring": "freeze.advanced",
    "monitor_tolerance": "freeze.advanced",
    "replan_threshold": "freeze.advanced",
    "replan_patience": "freeze.advanced",
    "replan_noise_k": "freeze.advanced",
    "replan_min_gain": "freeze.advanced",
    "resample_every": "freeze.advanced",
    "trace": "freeze.advanced",
    "stop_at_val_loss": "experiment",
    "cpu_pinning": "experiment",
}
"""Old ``[freeze]`` field -> the section it moved to (same field name there)."""


def names_base(homes: dict[str, type]) -> type:
    """A dataclass with a field per old name, of the type and default of the field in its new home
    (``homes``: section path -> its dataclass)."""
    spec = []
    for old, home in RENAMED.items():
        f = {x.name: x for x in dataclasses.fields(homes[home])}[old]
        spec.append((old, f.type, dataclasses.field(default=f.default)))
    return dataclasses.make_dataclass("DeprecatedFreezeNames", spec)


def apply_renames(job_config: Any) -> list[str]:
    """Move every old name of ``job_config.freeze`` that differs from its default to its new home; returns
    one warning line per old name used. An old and a new name both set, to different values, is an error."""
    freeze, warnings = job_config.freeze, []
    for old, home in RENAMED.items():
        section = _section(job_config, home)
        default = {f.name: f.default for f in dataclasses.fields(type(section))}[old]
        value = getattr(freeze, old)
        if value == default and type(value) is type(default):
            continue
        current = getattr(section, old)
        if current != default and current != value:
            raise FreezeConfigError(
                f"[freeze] {old} = {value!r} and [{home}] {old} = {current!r}: set only [{home}] {old} "
                "(the old name is deprecated)"
            )
        setattr(section, old, value)
        setattr(freeze, old, default)
        warnings.append(
            f"warning: [freeze] {old} is deprecated: it is now [{home}] {old} "
            f"(flag --{home}.{old}); the old name goes in the next release"
        )
    return warnings


def check_moved(freeze: Any) -> None:
    """Every old name holds its default: ``apply_renames`` has moved what was set (a ``[freeze]`` section
    checked without it is refused rather than its old names silently ignored)."""
    defaults = {f.name: f.default for f in dataclasses.fields(freeze)}
    for old, home in RENAMED.items():
        value = getattr(freeze, old)
        if value != defaults[old] or type(value) is not type(defaults[old]):
            raise FreezeConfigError(f"[freeze] {old} = {value!r}: this setting is now [{home}] {old}")


def _section(job_config: Any, path: str) -> Any:
    out = job_config
    for part in path.split("."):
        out = getattr(out, part)
    return out


def without_old_names(config_cls: type) -> type:
    """``config_cls`` (a merged TorchTitan job config) with the old ``[freeze]`` names hidden: used only to print
    ``--help``, so the help lists each setting once, in its new home. A run parses with ``config_cls`` itself,
    where the old names still parse (``names_base``). Returns ``config_cls`` unchanged when it has no
    ``[freeze]`` section (a config without ``custom_config_module``)."""
    import tyro  # TorchTitan's command-line parser: needed only here

    sections = {f.name: f for f in dataclasses.fields(config_cls)}
    if "freeze" not in sections:
        return config_cls
    freeze_cls = sections["freeze"].type
    old = [f for f in dataclasses.fields(freeze_cls) if f.name in RENAMED]
    namespace: dict[str, Any] = {
        "__annotations__": {f.name: Annotated[f.type, tyro.conf.Suppress] for f in old},
        "__module__": freeze_cls.__module__,
        "__qualname__": freeze_cls.__qualname__,
        "__doc__": freeze_cls.__doc__,
        **{f.name: f.default for f in old},
    }
    hidden = dataclasses.dataclass(type(freeze_cls.__name__, (freeze_cls,), namespace))
    spec = [
        (f.name, hidden, dataclasses.field(default_factory=hidden)) if f.name == "freeze" else (f.name, f.type, f)
        for f in dataclasses.fields(config_cls)
    ]
    return dataclasses.make_dataclass(config_cls.__name__, spec, bases=(config_cls,))
