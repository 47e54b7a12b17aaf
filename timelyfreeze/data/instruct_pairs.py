"""Instruction pairs, and the embedded ones built from the Python standard library's source.

A ``Pair`` is one prompt/response sample in the Alpaca shape (``instruction``, ``input``, ``output``) with the
``source`` it came from (a module, or a file and line). The embedded pairs take every public function and
method of a stdlib module that has a docstring: the prompt shows its module and signature, the response is the
docstring's first line (its summary). Nothing is downloaded: every machine that runs the project has the files.

The split is by source, never by line: a module's pairs are all training pairs or all held-out pairs, by the
embedded corpus's deterministic split of the file (``timelyfreeze.data.corpus.split_of``: its ``val`` split is
held out, so the debug model's pre-training never saw a held-out module either).
"""

from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass

from timelyfreeze.data import corpus

INSTRUCTION = "Summarize in one line what this Python standard-library function does."
SPLITS = ("train", "heldout")
_MIN_WORDS, _MAX_CHARS = 3, 160


@dataclass(frozen=True)
class Pair:
    instruction: str
    input: str
    output: str
    source: str
    """Where the pair came from: a stdlib module (``json.decoder``), or ``<file>:<line>``."""

    @property
    def user(self) -> str:
        """The user's message: the instruction, then the input after a blank line (when there is one)."""
        return f"{self.instruction}\n\n{self.input}" if self.input else self.instruction


def module_name(rel: str) -> str:
    """``json/decoder.py`` -> ``json.decoder``; ``json/__init__.py`` -> ``json``."""
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def summary_line(doc: str) -> str | None:
    """A docstring's first line when it makes a usable response (a few words, not too long), else None."""
    lines = inspect.cleandoc(doc).splitlines()
    first = lines[0].strip() if lines else ""
    if len(first.split()) < _MIN_WORDS or len(first) > _MAX_CHARS or first.endswith((":", ",")):
        return None
    return first


def pairs_of_source(text: str, module: str) -> list[Pair]:
    """The pairs of one module's source text (none when it does not parse), in source order."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    out: list[Pair] = []

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                summary = summary_line(doc) if doc else None
                if summary is None:
                    continue
                returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
                kw = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
                sig = f"# module {module}\n{kw} {prefix}{node.name}({ast.unparse(node.args)}){returns}"
                out.append(Pair(INSTRUCTION, sig, summary, module))

    visit(tree.body, "")
    return out


@functools.lru_cache(maxsize=None)
def stdlib_pairs(split: str) -> tuple[Pair, ...]:
    """The embedded pairs of ``split``: ``heldout`` (the modules of the corpus's ``val`` split) or ``train``
    (every other module), in a fixed order (the corpus's file order, then source order). A pair whose prompt
    and response both occur in the other split (the same function copied into two modules) is dropped from
    the held-out pairs."""
    if split not in SPLITS:
        raise ValueError(f"unknown instruction split {split!r}; choose one of {', '.join(SPLITS)}")
    root = corpus.stdlib_root()

    def of(corpus_split: str) -> list[Pair]:
        pairs = []
        for path in corpus.corpus_files(corpus_split):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            pairs += pairs_of_source(text, module_name(path.relative_to(root).as_posix()))
        return pairs

    train = of("train")
    if split == "train":
        return tuple(train)
    seen = {(p.input.split("\n", 1)[1], p.output) for p in train}
    return tuple(p for p in of("val") if (p.input.split("\n", 1)[1], p.output) not in seen)
