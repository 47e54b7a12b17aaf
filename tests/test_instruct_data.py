"""Instruction data (``timelyfreeze.data.instruct_data`` and its parts) and the held-out accuracy
(``timelyfreeze.data.choice_task``, ``timelyfreeze.titan.accuracy``), on a tokenizer built here (no model needed)."""

from __future__ import annotations

import itertools
import json
import types

import pytest
import torch

from timelyfreeze.config.instruct import Instruct
from timelyfreeze.data import choice_task, instruct_data, instruct_pairs
from timelyfreeze.data.alpaca import read_alpaca
from timelyfreeze.data.chat_template import ChatTemplate, encode_sample
from timelyfreeze.data.instruct_pairs import Pair
from timelyfreeze.job.errors import FreezeConfigError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A small byte-level BPE with ChatML's special tokens (ids 0, 1, 2 as in SmolLM2), loaded by TorchTitan."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["user assistant Summarize what this function does def f(x): return x"] * 20, trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
    )
    return HuggingFaceTokenizer(str(d))


def test_ignore_index_is_torchtitans():
    from torchtitan.components.loss import IGNORE_INDEX

    assert instruct_data.IGNORE_INDEX == IGNORE_INDEX == choice_task.IGNORE_INDEX


def test_chatml_renders_prompt_and_response():
    t = ChatTemplate()
    assert t.prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.response("yo") == "yo<|im_end|>\n"
    s = ChatTemplate(system="be brief")
    assert s.prompt("hi").startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n")
    llama = ChatTemplate(turn="<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    assert llama.prompt("q").endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama.response("a") == "a<|eot_id|>"


def test_special_markers_are_single_tokens(tokenizer):
    ids, n_prompt = encode_sample(tokenizer, ChatTemplate().prompt("def f(x)"), ChatTemplate().response("return x"))
    assert ids[0] == 1 and ids.count(1) == 2 and ids[-2] == 2  # <|im_start|> twice; the response ends <|im_end|>\n
    assert tokenizer.decode(ids[n_prompt:], skip_special_tokens=False) == "return x<|im_end|>\n"


def test_masking_keeps_response_tokens_only_and_packs_whole_samples():
    a = ([10, 11, 12, 13, 14], 3)  # prompt 10 11 12, response 13 14
    b = ([20, 21, 22, 23], 2)
    c = ([30, 31, 32], 1)
    tokens, labels = instruct_data.pack([a, b, c], seq_len=8, pad_id=0)
    assert tokens.tolist() == [[10, 11, 12, 13, 14, 20, 21, 22, 23], [30, 31, 32, 0, 0, 0, 0, 0, 0]]
    ig = instruct_data.IGNORE_INDEX
    # labels[j] is the target of position j: kept only where tokens[j + 1] is a response token
    assert labels.tolist() == [[ig, ig, 13, 14, ig, ig, 22, 23], [31, 32, ig, ig, ig, ig, ig, ig]]
    # the packing boundary: predicting the next sample's first (prompt) token costs nothing
    assert labels[0, 4] == ig


def test_a_sample_longer_than_the_sequence_is_an_error(tokenizer):
    pairs = [Pair("say a lot", "", "word " * 50, "big.jsonl:3")]
    with pytest.raises(FreezeConfigError, match=r"big\.jsonl:3 is \d+ tokens, longer than the sequence"):
        instruct_data.encode_pairs(pairs, ChatTemplate(), tokenizer, 16, "[instruct] data_path = 'big.jsonl'")
    # the embedded pairs leave such a sample out instead
    assert instruct_data.encode_pairs(pairs, ChatTemplate(), tokenizer, 16, "embedded", drop_long=True) == []


def test_alpaca_lines_and_array(tmp_path):
    recs = [{"instruction": "Add", "input": "1 2", "output": "3"}, {"instruction": "Greet", "output": "hello"}]
    lines = tmp_path / "a.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    array = tmp_path / "a.json"
    array.write_text(json.dumps(recs))
    for path in (lines, array):
        got = read_alpaca(path)
        assert [(p.user, p.output) for p in got] == [("Add\n\n1 2", "3"), ("Greet", "hello")]


@pytest.mark.parametrize(
    "text, needle",
    [
        ('{"instruction": "x"}\n', "line 1: field 'output' is missing"),
        ('{"output": "x"}\n', "line 1: field 'instruction' is missing"),
        (
            '{"instruction": "x", "output": "ok"}\n{"instruction": "y", "output": "  "}\n',
            "line 2: field 'output' is empty",
        ),
        ('{"instruction": "x", "output": 3}\n', "field 'output' must be a string"),
        ('{"instruction": "x", "input": 5, "output": "y"}\n', "field 'input' must be a string"),
        ('[{"instruction": "x", "output": ""}]', "record 0: field 'output' is empty (an empty response)"),
        ("{not json\n", "line 1 is not a JSON object"),
        ("", "holds no records"),
    ],
)
def test_alpaca_errors_name_the_file_and_the_field(tmp_path, text, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(FreezeConfigError) as e:
        read_alpaca(path)
    msg = str(e.value)
    assert "\n" not in msg and "[instruct] data_path" in msg and "bad.jsonl" in msg and needle in msg


def test_the_embedded_split_is_by_module_disjoint_and_fixed():
    train, held = instruct_pairs.stdlib_pairs("train"), instruct_pairs.stdlib_pairs("heldout")
    assert len(train) > 1000 and len(held) > 200
    assert not {p.source for p in train} & {p.source for p in held}
    from timelyfreeze.data import corpus

    val_modules = {
        instruct_pairs.module_name(f.relative_to(corpus.stdlib_root()).as_posix()) for f in corpus.corpus_files("val")
    }
    assert {p.source for p in held} <= val_modules
    assert not {p.source for p in train} & val_modules
    assert all(p.output and p.input.startswith(f"# module {p.source}\n") for p in held)


def test_pairs_of_source_take_public_documented_functions():
    src = '''
def add(a, b=1) -> int:
    """Add two numbers together.

    More text."""
class Box:
    def open(self, *, force=False):
        """Open the box if it is shut."""
    def _hidden(self):
        """A private helper method."""
def nodoc(x):
    pass
def short():
    """Too short."""
'''
    got = instruct_pairs.pairs_of_source(src, "pkg.mod")
    assert [(p.input.split("\n")[1], p.output) for p in got] == [
        ("def add(a, b=1) -> int", "Add two numbers together."),
        ("def Box.open(self, *, force=False)", "Open the box if it is shut."),
    ]


def _loader_batches(ds, n):
    from torchtitan.components.dataloader import ParallelAwareDataloader

    dl = ParallelAwareDataloader(ds, dp_rank=0, dp_world_size=1, batch_size=2)
    it = iter(dl)
    return dl, it, [next(it) for _ in range(n)]


def test_the_loader_resumes_exactly(tokenizer):
    pairs = [Pair("Say the number", "", f"number {i} " * (1 + i % 3), f"m{i}") for i in range(30)]
    samples = instruct_data.encode_pairs(pairs, ChatTemplate(), tokenizer, 96, "test")
    tokens, labels = instruct_data.pack(samples, 96, 0)
    make = lambda: instruct_data.FixedSequenceDataset(tokens, labels=labels)  # noqa: E731
    dl, it, first = _loader_batches(make(), 3)
    state = dl.state_dict()
    rest = [next(it) for _ in range(len(tokens))]  # past the end of an epoch
    dl2, _, _ = _loader_batches(make(), 0)
    dl2.load_state_dict(state)
    again = list(itertools.islice(iter(dl2), len(rest)))
    for (x, y), (x2, y2) in zip(rest, again):
        assert torch.equal(x["input"], x2["input"]) and torch.equal(y, y2)
    x, y = first[0]
    assert torch.equal(y, labels[:2]) and torch.equal(x["input"], tokens[:2, :-1])


def test_dataset_names_build_masked_data(tokenizer, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"instruction": "Echo", "input": str(i), "output": str(i)}) for i in range(9)))
    cfg = Instruct(data_path=str(path))
    ds = instruct_data.build_dataset("instruct", cfg, tokenizer, 32)
    assert (ds.labels != instruct_data.IGNORE_INDEX).any() and (ds.labels == instruct_data.IGNORE_INDEX).any()
    assert instruct_data.is_instruct("instruct_heldout") and not instruct_data.is_instruct("pystdlib_val")


def _pairs(n_sources=5, per=4):
    return [Pair("Q", f"sig {s}.{i}", f"answer {s}.{i}", f"mod{s}") for s in range(n_sources) for i in range(per)]


def test_questions_are_fixed_distinct_and_hold_their_answer():
    qs = choice_task.build_questions(_pairs(), 12, 4, seed=3)
    assert qs == choice_task.build_questions(_pairs(), 12, 4, seed=3) and len(qs) == 12
    for q in qs:
        assert len(set(q.options)) == 4 and q.options[q.answer] == "answer " + q.prompt.split("sig ")[1]
        src = q.prompt.split("sig ")[1].split(".")[0]
        assert all(o.startswith(f"answer {src}.") for o in q.options)  # same source: it has enough
    assert {q.answer for q in qs} != {qs[0].answer}  # the options' order is shuffled
    anywhere = choice_task.build_questions(_pairs(n_sources=5, per=2), 5, 4, seed=0)
    assert len(anywhere) == 5  # too few in a source: drawn from every source


def test_scorer_picks_the_most_likely_option(tokenizer):
    """A hand-built 'model' whose next-token distribution puts its mass on the tokens of one option: the
    rows' log-likelihoods pick it, so the accuracy is 1 where that option is the answer, 0 where it is not."""
    t = ChatTemplate()
    q = choice_task.Question("Pick", ("alpha", "beta gamma", "delta", "epsilon"), answer=1)
    inputs, labels, kept = choice_task.option_rows([q, q], t, tokenizer, 32, 0)
    assert kept == [q, q] and inputs.shape == (8, 32)
    good = set(tokenizer.encode("beta gamma", add_bos=False, add_eos=False))
    vocab = tokenizer.get_vocab_size()
    logits = torch.zeros(8, 32, vocab)
    logits[..., sorted(good)] = 5.0  # every position favours the right option's tokens
    scores = choice_task.row_loglik(logits, labels).tolist()
    acc = choice_task.accuracy(scores, kept)
    assert acc == choice_task.Accuracy(1.0, 1.0, 0.25, 2, "11", "11")
    wrong = choice_task.Question("Pick", q.options, answer=0)
    assert choice_task.accuracy(scores, [wrong, wrong]).acc == 0.0
    mixed = choice_task.accuracy(scores, [wrong, q])  # per question, in order: what a paired test reads
    assert (mixed.acc, mixed.right, mixed.right_norm) == (0.5, "01", "01")
    # the labels are exactly the options' tokens, after the prompt
    for r in range(4):
        opt = tokenizer.encode(q.options[r], add_bos=False, add_eos=False)
        assert labels[r][labels[r] != -100].tolist() == opt


def _scorer(tokenizer, tmp_path, batch_size: int):
    """A ``ChoiceScorer`` over 3 questions of 2 options from a held-out Alpaca file."""
    from timelyfreeze.titan.accuracy import ChoiceScorer

    path = tmp_path / "held.jsonl"
    path.write_text(
        "\n".join(json.dumps({"instruction": "Q", "input": p.input, "output": p.output}) for p in _pairs(2, 3))
    )
    return ChoiceScorer(Instruct(heldout_path=str(path), questions=3, choices=2, seed=1), tokenizer, 40, batch_size)


def _favouring_logits(tokenizer, labels):
    """'Logits' that favour each row's own label tokens (the same scores with a pipeline or without)."""
    logits = torch.zeros(*labels.shape, tokenizer.get_vocab_size())
    for r in range(labels.shape[0]):
        logits[r, :, labels[r][labels[r] != -100]] = 3.0
    return logits


def test_scorer_under_a_pipeline_reads_the_last_stage(tokenizer, tmp_path):
    """Under pipeline parallelism the scorer swaps the schedule's loss function for the per-row sums: a fake
    schedule calls it per microbatch as torch's does; the last stage's rank gets the accuracy, others None."""
    import contextlib

    scorer = _scorer(tokenizer, tmp_path, batch_size=4)
    assert len(scorer.questions) == 3 and scorer.rows == 6 and len(scorer.batches) == 2  # 6 rows + 2 filling

    class Schedule:
        _loss_fn = staticmethod(lambda out, tgt: out.sum())

        def eval(self, *args, target=None, losses=None, **kw):
            if target is None:  # not the last stage: no loss function runs here
                return
            for t in target.split(2):  # two microbatches
                losses.append(self._loss_fn(_favouring_logits(tokenizer, t), t))

    def validator(pp: bool, last: bool = True):
        return types.SimpleNamespace(
            parallel_dims=types.SimpleNamespace(pp_enabled=pp),
            pp_schedule=Schedule(),
            pp_has_first_stage=True,
            pp_has_last_stage=last,
            validation_context=contextlib.nullcontext,
            maybe_enable_amp=contextlib.nullcontext(),
            post_dataloading_process=lambda d, y, m: (d["input"], y, {}, {}),
        )

    v = validator(True)
    got = scorer.score(v, [torch.nn.Linear(1, 1)])
    assert got is not None and got.questions == 3 and got.chance == 0.5
    assert v.pp_schedule._loss_fn is Schedule._loss_fn  # restored
    assert scorer.score(validator(True, last=False), [torch.nn.Linear(1, 1)]) is None

    class Model(torch.nn.Module):  # without a pipeline: the model's own logits
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.labels = torch.cat([y for _, y in scorer.batches])
            self.at = 0

        def forward(self, x):
            y = self.labels[self.at : self.at + x.shape[0]]
            self.at += x.shape[0]
            return _favouring_logits(tokenizer, y)

    assert scorer.score(validator(False), [Model()]) == got


def test_accuracy_needs_validation_and_a_sane_section():
    from timelyfreeze.config.job_checks import check_instruct

    check_instruct(Instruct(questions=5), types.SimpleNamespace(enable=True))
    with pytest.raises(FreezeConfigError, match=r"^\[instruct\] questions = 5 needs validation"):
        check_instruct(Instruct(questions=5), types.SimpleNamespace(enable=False))
    with pytest.raises(FreezeConfigError, match=r"^\[instruct\] choices = 1: must be an integer >= 2"):
        check_instruct(Instruct(choices=1), types.SimpleNamespace(enable=True))
    with pytest.raises(FreezeConfigError, match=r"^\[instruct\] turn = .*must hold \{role\} and \{content\}"):
        check_instruct(Instruct(turn="<s>{content}"), types.SimpleNamespace(enable=True))


def test_the_summary_carries_the_last_accuracy():
    from timelyfreeze.outputs.summary import accuracy_fields

    a = choice_task.Accuracy(0.5, 0.25, 0.25, 8, "11110000", "11000000")
    curve = [{"step": 2, **choice_task.Accuracy(0.3, 0.2, 0.25, 8).row()}, {"step": 4, **a.row()}]
    assert accuracy_fields(curve) == {
        "val_acc": 0.5,
        "val_acc_norm": 0.25,
        "val_acc_chance": 0.25,
        "val_questions": 8,
        "val_acc_right": "11110000",
        "val_acc_norm_right": "11000000",
        "acc_curve": [[2, 0.3], [4, 0.5]],
    }
    assert accuracy_fields([])["val_acc"] is None
