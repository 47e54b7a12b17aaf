"""The freezing state saved in TorchTitan checkpoints, as plain data: JSON text, never pickle.

A checkpoint is a file someone may hand you. The freezing state travels in it as one JSON string
(``timelyfreeze-state/1``), and loading it runs no code: ``decode`` only builds dicts, lists, strings,
numbers, tuples and tensors (raw little-endian bytes of a whitelisted dtype, base64). Python values JSON
has no form for are tagged so they come back exactly as saved: a dict with non-string keys
(``{"__dict__": [[k, v], ...]}``), a tuple (``{"__tuple__": [...]}``), a tensor
(``{"__tensor__": {"dtype", "shape", "data"}}``). Anything else is refused when saving.

Caveat outside this module: torch's DCP stores every non-tensor value of a state dict with
``torch.save`` and reads it back with ``torch.load(weights_only=False)``, and its ``.metadata`` file is a
pickle too. So a DCP checkpoint from an untrusted source is unsafe to load whatever we store; this
module makes sure our state adds no pickle of its own and that a tampered or truncated state is
refused with a clear error instead of restoring a wrong phase.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import torch

from timelyfreeze.job.errors import FreezeStateError

STATE_FORMAT = "timelyfreeze-state/1"

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}
_TAGS = ("__dict__", "__tuple__", "__tensor__")


def encode(obj: Any) -> str:
    """JSON text of ``obj`` (dicts, lists, tuples, str, int, float, bool, None, CPU-copyable tensors)."""
    return json.dumps(_to_plain(obj, "state"), separators=(",", ":"), allow_nan=True)


def decode(text: Any) -> Any:
    """The value ``encode`` was given. Raises :class:`FreezeStateError` for anything else."""
    if isinstance(text, (bytes, bytearray)):
        raise FreezeStateError(
            "the freezing state is binary data, not JSON text (a checkpoint from an older version stored "
            "it as a pickle, which is never loaded)"
        )
    if not isinstance(text, str):
        raise FreezeStateError(f"the freezing state is a {type(text).__name__}, not JSON text")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise FreezeStateError(f"the freezing state is not valid JSON (truncated or corrupted?): {e}") from None
    return _from_plain(raw, "state")


def _to_plain(obj: Any, where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"{where}: tensor dtype {t.dtype} cannot be saved in the freezing state")
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"__tensor__": {"dtype": dtype, "shape": list(t.shape), "data": base64.b64encode(data).decode()}}
    if isinstance(obj, tuple):
        return {"__tuple__": [_to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k in _TAGS for k in obj):
            return {k: _to_plain(v, f"{where}.{k}") for k, v in obj.items()}
        return {"__dict__": [[_to_plain(k, f"{where} key"), _to_plain(v, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise TypeError(f"{where}: a {type(obj).__name__} cannot be saved in the freezing state (plain data only)")


def _from_plain(raw: Any, where: str) -> Any:
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, list):
        return [_from_plain(v, f"{where}[{i}]") for i, v in enumerate(raw)]
    if not isinstance(raw, dict):
        raise FreezeStateError(f"{where}: unexpected {type(raw).__name__}")
    tags = [k for k in _TAGS if k in raw]
    if not tags:
        return {k: _from_plain(v, f"{where}.{k}") for k, v in raw.items()}
    if len(raw) != 1:
        raise FreezeStateError(f"{where}: a {tags[0]} entry must be the object's only key")
    tag, body = tags[0], raw[tags[0]]
    if tag == "__tuple__":
        if not isinstance(body, list):
            raise FreezeStateError(f"{where}: __tuple__ must hold a list")
        return tuple(_from_plain(v, f"{where}[{i}]") for i, v in enumerate(body))
    if tag == "__dict__":
        if not isinstance(body, list) or not all(isinstance(p, list) and len(p) == 2 for p in body):
            raise FreezeStateError(f"{where}: __dict__ must hold [key, value] pairs")
        out = {}
        for k, v in body:
            key = _from_plain(k, f"{where} key")
            try:
                hash(key)
            except TypeError:
                raise FreezeStateError(f"{where}: key {k!r} is not hashable") from None
            out[key] = _from_plain(v, f"{where}[{k!r}]")
        return out
    return _tensor(body, where)


def _tensor(body: Any, where: str) -> torch.Tensor:
    if not isinstance(body, dict) or set(body) != {"dtype", "shape", "data"}:
        raise FreezeStateError(f"{where}: __tensor__ needs exactly dtype, shape and data")
    dtype = _DTYPES.get(body["dtype"]) if isinstance(body["dtype"], str) else None
    if dtype is None:
        raise FreezeStateError(f"{where}: tensor dtype {body['dtype']!r} is not one of {', '.join(_DTYPES)}")
    shape = body["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise FreezeStateError(f"{where}: tensor shape {shape!r} must be a list of non-negative integers")
    if not isinstance(body["data"], str):
        raise FreezeStateError(f"{where}: tensor data must be base64 text")
    try:
        data = base64.b64decode(body["data"], validate=True)
    except ValueError:
        raise FreezeStateError(f"{where}: tensor data is not valid base64") from None
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(data) != numel * itemsize:
        raise FreezeStateError(
            f"{where}: tensor data has {len(data)} bytes, shape {shape} of {body['dtype']} needs {numel * itemsize}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape).clone()
