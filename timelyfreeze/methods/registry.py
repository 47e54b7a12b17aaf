"""``[freeze] method`` name -> method class."""

from __future__ import annotations

import importlib
import inspect

from timelyfreeze.methods.base import FreezeMethod

_MODULES = {
    "none": "timelyfreeze.methods.base",
    "timelyfreeze": "timelyfreeze.methods.timely",
    "timelyfreeze_apf": "timelyfreeze.methods.hybrid",
    "timelyfreeze_autofreeze": "timelyfreeze.methods.hybrid",
    "apf": "timelyfreeze.methods.apf",
    "autofreeze": "timelyfreeze.methods.autofreeze",
    "egeria": "timelyfreeze.methods.egeria",
    "smartpipe": "timelyfreeze.methods.smartpipe",
    "random": "timelyfreeze.methods.random_fixed",
}


def method_class(name: str) -> type[FreezeMethod]:
    if name not in _MODULES:
        raise ValueError(f"unknown freezing method {name!r}; choose one of {', '.join(_MODULES)}")
    module = importlib.import_module(_MODULES[name])
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, FreezeMethod) and obj.__dict__.get("name") == name:
            return obj
    raise ValueError(f"freezing method {name!r}: no class with name = {name!r} in {_MODULES[name]}")
