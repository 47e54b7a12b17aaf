"""The embedded, offline training corpus: the Python standard library's own source files.

Every machine that runs this project has them, so nothing is downloaded. Files are split
deterministically (by a hash of their path relative to the stdlib root) into disjoint parts:

| split | share | used for |
|---|---|---|
| ``val``      | 10 % | held-out validation (TorchTitan ``[validation]``) |
| ``pretrain`` | 45 % | pre-training the fine-tuning starting checkpoint |
| ``finetune`` | 45 % | fine-tuning runs that compare freezing methods |
| ``train``    | ``pretrain`` + ``finetune`` | training from scratch |

A byte-level BPE tokenizer (vocab 2048, the llama3 debug model's vocab size) is trained on the
``train`` split at first use and cached under ``$TIMELYFREEZE_CACHE`` (default
``~/.cache/timelyfreeze``); concurrent ranks wait on a file lock while one builds it.

TorchTitan sees the splits as datasets ``pystdlib_<split>`` (``[training] dataset`` /
``[validation] dataset``) once ``register_datasets()`` ran, and the tokenizer through
``[model] hf_assets_path = "pystdlib"`` (resolved by ``resolve_assets``).

``pystdlib_val_heads`` is the ``val`` split cut to the first ``HEAD_CHARS`` characters of each file (at a line
end). TorchTitan packs texts into sequences in order, so a few validation batches of ``pystdlib_val`` score
one or two files, whose loss barely moves while fine-tuning on other files; the heads put dozens of files
into the same few batches.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from timelyfreeze.job.errors import FreezeConfigError

VOCAB_SIZE = 2048
SPLITS = ("train", "val", "pretrain", "finetune")
ASSETS_MARKER = "pystdlib"
"""Value of ``[model] hf_assets_path`` that means "the embedded tokenizer"."""
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def cache_dir() -> Path:
    base = os.environ.get("TIMELYFREEZE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "timelyfreeze"
    )
    return Path(base)


def _bucket(rel: str) -> int:
    return int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16) % 100


def split_of(rel: str) -> str:
    """The split a stdlib file (path relative to the stdlib root, '/'-separated) belongs to."""
    b = _bucket(rel)
    if b < 10:
        return "val"
    return "pretrain" if b < 55 else "finetune"


def corpus_files(split: str) -> list[Path]:
    """The stdlib ``.py`` files of ``split``, in a fixed pseudo-random (hash) order."""
    if split not in SPLITS:
        raise ValueError(f"unknown corpus split {split!r}; choose one of {', '.join(SPLITS)}")
    root = stdlib_root()
    wanted = {"pretrain", "finetune"} if split == "train" else {split}
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                rel = Path(dirpath, name).relative_to(root).as_posix()
                if split_of(rel) in wanted:
                    found.append((hashlib.sha1(rel.encode()).hexdigest(), Path(dirpath, name)))
    return [p for _, p in sorted(found)]


def read_texts(split: str) -> list[str]:
    texts = []
    for p in corpus_files(split):
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if t.strip():
            texts.append(t)
    return texts


HEAD_CHARS = 1200
"""Characters kept from each file by ``pystdlib_val_heads`` (about 1.5 sequences of 256 tokens)."""


def head_of(text: str, chars: int = HEAD_CHARS) -> str:
    """The first ``chars`` characters of ``text``, cut back to the last line end within them (if any)."""
    if len(text) <= chars:
        return text
    cut = text.rfind("\n", 0, chars)
    return text[: cut + 1] if cut > 0 else text[:chars]


def tokenizer_dir() -> Path:
    v = sys.version_info
    return cache_dir() / f"pystdlib-py{v.major}{v.minor}-bpe{VOCAB_SIZE}"


@contextlib.contextmanager
def locked(path: Path):
    """Hold an exclusive lock on ``path`` (created) while building something in the cache: one process builds,
    the others wait and then find it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_tokenizer() -> Path:
    """Train (once) and return the directory holding ``tokenizer.json`` + ``tokenizer_config.json``."""
    out = tokenizer_dir()
    if (out / "tokenizer.json").exists():
        return out
    with locked(out.with_name(out.name + ".lock")):
        if (out / "tokenizer.json").exists():
            return out
        # deferred: heavy, and needed only when the corpus is built
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=[BOS, EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(read_texts("train"), trainer=trainer)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": BOS, "eos_token": EOS, "add_bos_token": False, "add_eos_token": False})
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    return out


def resolve_assets(job_config) -> None:
    """Point ``[model] hf_assets_path = "pystdlib"`` at the (built on demand) embedded tokenizer."""
    if job_config.model.hf_assets_path == ASSETS_MARKER:
        job_config.model.hf_assets_path = str(ensure_tokenizer())


PRETRAINED_MARKER = "pystdlib-pretrained"
"""Value of ``[checkpoint] initial_load_path`` that means "the pre-trained debug model" (``pretrained_checkpoint``)."""
PRETRAIN_CONFIG = "llama3_debug_pretrain_cpu.toml"


def pretrained_dir() -> Path:
    """Dump folder of a pre-training run built on this machine (``timelyfreeze.experiments.pretrain``)."""
    v = sys.version_info
    return cache_dir() / f"pretrained-llama3-debugmodel-py{v.major}{v.minor}"


COMMITTED_PRETRAINED = Path(__file__).resolve().parents[2] / "checkpoints" / "llama3-debugmodel-py311"
"""The pre-trained checkpoint that ships with the repository (``checkpoints/``, a data folder outside the import
package; ``checkpoint/step-*/``, model weights only), with the sha256 of the tokenizer it was trained with
(``tokenizer.sha256``) and its ``pretrain.log``. Pre-training on another CPU gives another checkpoint (float
sums in another order), so fine-tuning results are only comparable across machines when every machine starts
from this one."""


def last_checkpoint(ckpt: Path) -> Path | None:
    """The highest ``step-<n>`` folder under a TorchTitan checkpoint folder, or None."""
    steps = (
        sorted((int(d.name.split("-")[1]), d) for d in ckpt.glob("step-*") if d.name.split("-")[1].isdigit())
        if ckpt.is_dir()
        else []
    )
    return steps[-1][1] if steps else None


def tokenizer_sha256() -> str:
    """sha256 of this machine's embedded tokenizer (``tokenizer.json``; built on demand)."""
    return hashlib.sha256((ensure_tokenizer() / "tokenizer.json").read_bytes()).hexdigest()


def committed_pretrained_mismatch() -> str | None:
    """Why the committed checkpoint does not apply here (None when it does): another Python (another stdlib
    corpus) or another tokenizer than the one it was trained with."""
    marker = COMMITTED_PRETRAINED / "tokenizer.sha256"
    if (
        sys.version_info[:2] != (3, 11)
        or not marker.is_file()
        or last_checkpoint(COMMITTED_PRETRAINED / "checkpoint") is None
    ):
        return f"no committed checkpoint for Python {sys.version_info.major}.{sys.version_info.minor}"
    want = marker.read_text().split()[0]
    have = tokenizer_sha256()
    if want != have:
        return f"it was trained with tokenizer {want[:16]}, this machine built tokenizer {have[:16]}"
    return None


def pretrained_checkpoint() -> Path | None:
    """The checkpoint fine-tuning starts from: the committed one (``COMMITTED_PRETRAINED``) when it matches
    this machine's tokenizer, else the last checkpoint of a pre-training run built here, else None."""
    if committed_pretrained_mismatch() is None:
        return last_checkpoint(COMMITTED_PRETRAINED / "checkpoint")
    step = last_checkpoint(pretrained_dir() / "checkpoint")
    return step if step is not None and (pretrained_dir() / "DONE").exists() else None


def start_fingerprint() -> str | None:
    """What a fine-tuning run starts from, as a short hash: the tokenizer (``tokenizer.json``) and the
    pre-trained checkpoint's files (``pretrained_checkpoint``). None when there is no checkpoint.

    Runs compared with each other (a freezing job and the no-freezing job of its seed) must carry the same
    fingerprint (``timelyfreeze.experiments``). Before the checkpoint was committed each machine built its
    own, and the same pre-training on another host gave another one (step-1 fine-tuning loss 5.139 against
    5.044)."""
    ckpt = pretrained_checkpoint()
    tok = tokenizer_dir() / "tokenizer.json"
    if ckpt is None or not tok.is_file():
        return None
    h = hashlib.sha256(tok.read_bytes())
    for f in sorted(q for q in ckpt.rglob("*") if q.is_file()):
        h.update(f.relative_to(ckpt).as_posix().encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def resolve_initial_load(job_config) -> None:
    """Point ``initial_load_path = "pystdlib-pretrained"`` at ``pretrained_checkpoint()`` (error if none)."""
    if job_config.checkpoint.initial_load_path == PRETRAINED_MARKER:
        path = pretrained_checkpoint()
        if path is None:
            raise FreezeConfigError(
                f'[checkpoint] initial_load_path = "{PRETRAINED_MARKER}": the pre-trained checkpoint is not built '
                f"yet ({pretrained_dir()}); build it once with: python scripts/pretrain.py"
            )
        job_config.checkpoint.initial_load_path = str(path)


def _load_split(split: str):
    from datasets import Dataset  # deferred: heavy, and needed only when the corpus is built

    return Dataset.from_dict({"text": read_texts(split)})


def _load_heads(split: str):
    from datasets import Dataset  # deferred: heavy, and needed only when the corpus is built

    return Dataset.from_dict({"text": [head_of(t) for t in read_texts(split)]})


def register_datasets() -> None:
    """Make ``pystdlib_<split>`` and ``pystdlib_val_heads`` known to TorchTitan's text dataset registry."""
    # deferred: TorchTitan is imported after the CPU shims (timelyfreeze.train)
    from torchtitan.hf_datasets import DatasetConfig, text_datasets

    for split in SPLITS:
        text_datasets.DATASETS[f"{ASSETS_MARKER}_{split}"] = DatasetConfig(
            path=split, loader=_load_split, sample_processor=lambda s: s["text"]
        )
    text_datasets.DATASETS[f"{ASSETS_MARKER}_val_heads"] = DatasetConfig(
        path="val", loader=_load_heads, sample_processor=lambda s: s["text"]
    )
