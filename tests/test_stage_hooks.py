"""``timelyfreeze.hooks.stage_hooks`` on a stand-in stage (no process group): the listeners run around each compute
call in order (``before_action`` in list order, ``after_action`` in reverse), a second ``install`` replaces them,
``uninstall`` gives the plain class back, and calls without autograd pass straight through."""

from __future__ import annotations

import torch

from timelyfreeze.hooks import stage_hooks


class Stage:
    """The three compute methods torch's schedules call, recording their calls."""

    stage_index = 2
    has_backward = True

    def __init__(self, log: list):
        self.log = log

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.log.append(("compute", "F", fwd_chunk_id))
        return fwd_chunk_id

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        self.log.append(("compute", "B" if full_backward else "I", bwd_chunk_id))

    def backward_weight_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        self.log.append(("compute", "W", bwd_chunk_id))


class Listener:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def before_action(self, stage, kind, microbatch):
        self.log.append((f"{self.name} before", stage, kind, microbatch))

    def after_action(self, stage, kind, microbatch):
        self.log.append((f"{self.name} after", stage, kind, microbatch))


def test_listeners_run_around_every_compute_call_and_install_replaces_them():
    log: list = []
    stage = Stage(log)
    stage_hooks.install(stage, [Listener("a", log), Listener("b", log)])
    assert stage.forward_one_chunk(5) == 5
    stage.backward_one_chunk(5, full_backward=False)
    stage.backward_weight_one_chunk(5)
    assert log == [
        *[("a before", 2, "F", 5), ("b before", 2, "F", 5), ("compute", "F", 5), ("b after", 2, "F", 5)],
        *[("a after", 2, "F", 5), ("a before", 2, "I", 5), ("b before", 2, "I", 5), ("compute", "I", 5)],
        *[("b after", 2, "I", 5), ("a after", 2, "I", 5), ("a before", 2, "W", 5), ("b before", 2, "W", 5)],
        *[("compute", "W", 5), ("b after", 2, "W", 5), ("a after", 2, "W", 5)],
    ]
    log.clear()
    stage_hooks.install(stage, [Listener("c", log)])  # the listeners' methods are looked up again
    stage.backward_one_chunk(1)
    assert log == [("c before", 2, "B", 1), ("compute", "B", 1), ("c after", 2, "B", 1)]
    log.clear()
    with torch.no_grad():  # (validation forwards)
        stage.forward_one_chunk(0)
    stage_hooks.uninstall(stage)
    assert type(stage) is Stage and not hasattr(stage, "_before")
    stage.forward_one_chunk(1)
    assert log == [("compute", "F", 0), ("compute", "F", 1)]
