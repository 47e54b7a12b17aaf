"""A llama-architecture GGUF file (llama.cpp's format) as a Hugging Face folder that TorchTitan's HF load path reads.

``convert(gguf_path, out_dir)`` writes, through a temporary folder renamed into place (so a folder that exists
is whole):

* ``config.json``: ``LlamaForCausalLM`` with the file's hyper-parameters;
* ``model.safetensors``: every weight dequantized to float32, in HF's names, with ``lm_head.weight`` even where
  the file ties the output to the token embedding (TorchTitan's HF reader reads the output layer from it);
* ``tokenizer.json``: the file's byte-level BPE (tokens and merges) rebuilt with the ``tokenizers`` library,
  its control tokens as special tokens; ``tokenizer_config.json`` (BOS, EOS, chat template);
  ``generation_config.json``.

Layouts: llama.cpp stores the query and key projections with each head's rows in Meta's interleaved rotary
order (pairs ``(2i, 2i+1)`` rotate together; TorchTitan's own layout); HF's ``LlamaForCausalLM`` rotates the two
halves of a head (``i`` with ``i + head_dim/2``). The converter moves them to HF's order, and TorchTitan's llama3
state-dict adapter moves them back on load, as it does for any HF Llama checkpoint.

A file that is missing, not GGUF, not llama, or lacks a field ends in ``AssetError`` naming the file and field.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from timelyfreeze.job.errors import FreezeConfigError


class AssetError(FreezeConfigError):
    """A model file or folder that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters of a llama-architecture checkpoint, in HF ``config.json``'s terms."""

    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    rope_theta: float
    norm_eps: float
    context_length: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass(frozen=True)
class BpeVocab:
    """A GPT-2-style byte-level BPE as a GGUF file stores it."""

    tokens: list[str]
    control: list[int]  # ids of the control (special) tokens
    merges: list[str]  # "left right"
    pre: str  # llama.cpp's pre-tokenizer name
    bos_id: int
    eos_id: int
    unk_id: int | None
    pad_id: int | None
    chat_template: str | None


# The GGUF pre-tokenizers this converter rebuilds: llama.cpp's "smollm" (and StarCoder's) split every digit on
# its own before GPT-2's regex; "gpt2" is GPT-2's regex alone.
_DIGITS_FIRST = ("smollm", "starcoder", "refact")
_GPT2 = ("gpt2", "default")
_CONTROL = 3  # llama.cpp's token type of a control token

# GGUF tensor name (block part left out) -> HF name
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _reader(path: Path):
    import gguf  # deferred: needed only to convert

    if not path.is_file():
        raise AssetError(f"{path}: no such file")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError, ... on a damaged file
        raise AssetError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, path: Path, key: str, kind: type | None = None):
    field = reader.fields.get(key)
    if field is None:
        raise AssetError(f"{path}: field {key} is missing")
    try:
        value = field.contents()
    except Exception as e:
        raise AssetError(f"{path}: field {key} is unreadable ({e})") from None
    if kind is not None and not isinstance(value, kind):
        raise AssetError(f"{path}: field {key} = {value!r}: expected {getattr(kind, '__name__', 'a number')}")
    return value


def _optional(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_shape(reader, path: Path) -> LlamaShape:
    arch = _field(reader, path, "general.architecture", str)
    if arch != "llama":
        raise AssetError(f"{path}: field general.architecture = {arch!r}: only 'llama' converts")
    shape = LlamaShape(
        n_layers=_field(reader, path, "llama.block_count", int),
        dim=_field(reader, path, "llama.embedding_length", int),
        ffn_dim=_field(reader, path, "llama.feed_forward_length", int),
        n_heads=_field(reader, path, "llama.attention.head_count", int),
        n_kv_heads=_field(reader, path, "llama.attention.head_count_kv", int),
        vocab_size=len(_field(reader, path, "tokenizer.ggml.tokens", list)),
        rope_theta=float(_field(reader, path, "llama.rope.freq_base", (float, int))),
        # stored as float32: 1e-5 reads 9.99999975e-06; 7 digits give back the written value
        norm_eps=float(f"{_field(reader, path, 'llama.attention.layer_norm_rms_epsilon', (float, int)):.7g}"),
        context_length=_field(reader, path, "llama.context_length", int),
    )
    if shape.dim % shape.n_heads or shape.n_heads % shape.n_kv_heads:
        raise AssetError(f"{path}: field llama.attention.head_count = {shape.n_heads}: does not divide the width")
    if _optional(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise AssetError(f"{path}: field llama.rope.scaling.type: RoPE scaling is not converted")
    return shape


def read_vocab(reader, path: Path) -> BpeVocab:
    model = _field(reader, path, "tokenizer.ggml.model", str)
    if model != "gpt2":
        raise AssetError(f"{path}: field tokenizer.ggml.model = {model!r}: only 'gpt2' (byte-level BPE) converts")
    pre = _optional(reader, "tokenizer.ggml.pre") or "default"
    if pre not in _DIGITS_FIRST + _GPT2:
        raise AssetError(f"{path}: field tokenizer.ggml.pre = {pre!r}: not one of {_DIGITS_FIRST + _GPT2}")
    tokens = _field(reader, path, "tokenizer.ggml.tokens", list)
    types = _field(reader, path, "tokenizer.ggml.token_type", list)
    if len(types) != len(tokens):
        raise AssetError(f"{path}: field tokenizer.ggml.token_type: {len(types)} types for {len(tokens)} tokens")
    return BpeVocab(
        tokens=tokens,
        control=[i for i, t in enumerate(types) if t == _CONTROL],
        merges=_field(reader, path, "tokenizer.ggml.merges", list),
        pre=pre,
        bos_id=_field(reader, path, "tokenizer.ggml.bos_token_id", int),
        eos_id=_field(reader, path, "tokenizer.ggml.eos_token_id", int),
        unk_id=_optional(reader, "tokenizer.ggml.unknown_token_id"),
        pad_id=_optional(reader, "tokenizer.ggml.padding_token_id"),
        chat_template=_optional(reader, "tokenizer.chat_template"),
    )


def interleaved_to_halves(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a query/key projection from Meta's interleaved rotary order (llama.cpp, TorchTitan) to HF's
    rotate-half order: within each head, row ``2i + j`` becomes row ``j * head_dim/2 + i``."""
    out, cols = w.shape
    half = out // n_heads // 2
    return w.reshape(n_heads, half, 2, cols).transpose(0, 2, 1, 3).reshape(out, cols)


def hf_name(gguf_name: str) -> str | None:
    """HF's name of a GGUF tensor, or None for one this converter does not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"
    return None


def read_weights(reader, path: Path, shape: LlamaShape) -> dict[str, np.ndarray]:
    """Every tensor dequantized to float32 under its HF name, q/k in HF's layout, ``lm_head.weight`` included."""
    import gguf  # deferred: needed only to convert

    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise AssetError(f"{path}: tensor {t.name}: not part of a llama checkpoint this converter knows")
        try:
            w = np.asarray(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except Exception as e:
            raise AssetError(f"{path}: tensor {t.name}: cannot dequantize ({e})") from None
        want = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists the fastest dimension first
        w = w.reshape(want[0]) if len(want) == 1 else w.reshape(want)
        if name.endswith("q_proj.weight"):
            w = interleaved_to_halves(w, shape.n_heads)
        elif name.endswith("k_proj.weight"):
            w = interleaved_to_halves(w, shape.n_kv_heads)
        weights[name] = np.ascontiguousarray(w)
    if "lm_head.weight" not in weights:  # tied output: TorchTitan's HF reader needs the tensor itself
        if "model.embed_tokens.weight" not in weights:
            raise AssetError(f"{path}: tensor token_embd.weight is missing")
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    want_names = {hf_name(n) for n in _GLOBAL_NAMES} | {
        f"model.layers.{i}.{b}" for i in range(shape.n_layers) for b in _BLOCK_NAMES.values()
    }
    missing = sorted(want_names - weights.keys())
    if missing:
        raise AssetError(f"{path}: tensor for {missing[0]} is missing ({len(missing)} missing)")
    return weights


def _tokenizer_json(vocab: BpeVocab) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # deferred: heavy

    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab.tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if vocab.pre in _DIGITS_FIRST
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(vocab.tokens[i], special=True, normalized=False) for i in vocab.control])
    return tok.to_str()


def _tokenizer_config(vocab: BpeVocab, shape: LlamaShape) -> dict:
    def name(i):
        return None if i is None else vocab.tokens[i]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(vocab.bos_id),
        "eos_token": name(vocab.eos_id),
        "unk_token": name(vocab.unk_id),
        "pad_token": name(vocab.pad_id),
        # TorchTitan's text datasets ask for BOS and EOS around each document themselves
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": shape.context_length,
        "added_tokens_decoder": {
            str(i): {
                "content": vocab.tokens[i],
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i in vocab.control
        },
    }
    if vocab.chat_template is not None:
        config["chat_template"] = vocab.chat_template
    return {k: v for k, v in config.items() if v is not None}


def hf_config(shape: LlamaShape, vocab: BpeVocab, *, tied: bool) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.dim,
        "intermediate_size": shape.ffn_dim,
        "num_hidden_layers": shape.n_layers,
        "num_attention_heads": shape.n_heads,
        "num_key_value_heads": shape.n_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.context_length,
        "rms_norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": None,
        "vocab_size": shape.vocab_size,
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.eos_id,
        "pad_token_id": vocab.pad_id,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


CONVERTER_VERSION = 1
"""Raised whenever a change to this module changes what it writes: cached folders of older versions are redone."""


def stamp(gguf_path: Path) -> str:
    """The ``SOURCE`` file of a converted folder: the converter's version and the file it came from."""
    return f"timelyfreeze.models.gguf_llama {CONVERTER_VERSION}: {Path(gguf_path).name}\n"


def is_converted(out_dir: Path, gguf_path: Path) -> bool:
    """Whether ``out_dir`` is this converter version's folder of ``gguf_path`` (a stale or foreign one is not)."""
    source = Path(out_dir) / "SOURCE"
    return source.is_file() and source.read_text() == stamp(gguf_path)


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write the HF folder of ``gguf_path`` to ``out_dir`` (replacing it), through a temporary folder beside it."""
    from safetensors.numpy import save_file  # deferred: needed only to convert

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _reader(gguf_path)
    shape = read_shape(reader, gguf_path)
    vocab = read_vocab(reader, gguf_path)
    tied = "output.weight" not in {t.name for t in reader.tensors}
    weights = read_weights(reader, gguf_path, shape)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + ".tmp"))
    try:
        tmp.chmod(0o755)  # mkdtemp's folder is private; the cache is not
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del weights
        (tmp / "tokenizer.json").write_text(_tokenizer_json(vocab))
        files = {
            "config.json": hf_config(shape, vocab, tied=tied),
            "tokenizer_config.json": _tokenizer_config(vocab, shape),
            "generation_config.json": {
                "bos_token_id": vocab.bos_id,
                "eos_token_id": vocab.eos_id,
                "pad_token_id": vocab.pad_id,
            },
        }
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2) + "\n")
        (tmp / "SOURCE").write_text(stamp(gguf_path))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
