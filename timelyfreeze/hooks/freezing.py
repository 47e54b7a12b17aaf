"""The one freezing hook every method goes through.

Before the forward of microbatch ``m`` on stage ``s`` the hook asks the method which parameter
tensors that microbatch leaves out and sets ``requires_grad=False`` on them for the call (and, below,
for the microbatch's other actions). The autograd graph recorded for ``m`` then has no edge to those
leaves, so the backward of ``m`` -- full (B) or split (I then W) -- neither computes nor accumulates
their weight gradient, while other microbatches (recorded with the tensors trainable) are untouched and every other
gradient is computed by exactly the same operations as without freezing.

Every other action of ``m`` (B, I, W) runs with the same set off, and the switch moves from one set to the next
(``ParamSwitch.move``): only the tensors whose flag differs are set, and after the stage's last backward of the batch
(every microbatch's B or W ended) every tensor is on again. A tensor in ``m``'s set is in none of ``m``'s graph, so
an action of ``m`` never needs it on; every tensor outside the set is on for every action of ``m``, as the graph
recorded at the forward needs (a B accumulates no gradient into a tensor switched off, and W finds the accumulators
of ``m``'s weights through their flags). Off at I and W, torch skips looking up a frozen tensor's gradient
accumulator (a ``view_as`` each, about 3.7 us warm); and on a stage with activation checkpointing
(``checkpoint_wrapper``, as TorchTitan applies it), where the forward is recomputed inside the backward, the
recomputation sees the flags of the original forward, as it must (otherwise autograd would save a different set of
tensors and the checkpoint's recomputed graph would not match). Between two actions of one stage the flags stay as
the first left them: two random sets with ratio ``r`` share ``r**2`` of the tensors on average, so going straight
from one to the next sets about ``2 r (1 - r)`` of the stage's flags where switching back on after each action and
off before the next set ``2 r``; and the action after an I of the same microbatch (its W, in the zero-bubble
schedules) sets none.

Under FSDP2 the stage computes with unsharded copies of its parameters; ``timelyfreeze.hooks.param_switch``
sets the flag on those too. Every data-parallel replica of a stage draws the same masks (they depend
only on seed, step, stage, microbatch and accumulation batch), so FSDP's reduce-scatter at the end of
the step sums, on every rank, gradients of the same tensors.

Where the method's masks are fixed within a batch (``FreezeMethod.masks_fixed_in_batch``) and the hook is told
``draw_ahead`` (the runtime does so on a CPU), the masks of every local (stage, microbatch) of a batch are drawn at
once, the same draws a forward would make for itself: when the batch begins (``prepare``, before the pipeline runs,
where every rank but the first waits for its first input anyway), or else at the batch's first forward. On a CPU a
draw made between two actions runs with the caches the action before it left cold (one diagnostic job, the debug
model's last 1F1B stage: its 8 draws took about 1.3 ms a step one forward at a time, and the hook's whole time fell
from 2.0 to 0.75 ms a step when they were drawn together). On a GPU the host runs ahead of the device, so the draws
stay with their forwards, where they overlap the device's work. A set a method hands over again (a plan's microbatches
at ratio 0 or 1 hand the empty set and every tensor, step after step) takes its ordered tensors and mask from the last
time (``_ordered_of``, ``_mask_of``; a bounded number per stage).

The hook also records, per backward action and gradient-accumulation batch, the applied freeze ratio
by elements; a DualPipeV ``OVERLAP_F_B`` pair records the ratio of its backward part (the forward part
draws the masks of its own microbatch, whose backward comes later, as any forward does).
"""

from __future__ import annotations

import threading
from typing import Callable

from timelyfreeze.hooks.param_switch import ParamSwitch
from timelyfreeze.hooks.stage_hooks import ActionNames
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.base import FreezeMethod

Mask = tuple[tuple[str, ...], float, int]
"""One forward's draw: the frozen tensors (registration order), the applied ratio by elements, and the tensors as the
stage's switch takes them (``ParamSwitch.bits``)."""

_KNOWN_SETS = 64
"""Sets a stage keeps the draw and mask of (``FreezingHook._ordered_of``, ``_mask_of``; emptied when full: random
draws rarely repeat)."""

_NO_MASK: Mask = ((), 0.0, 0)
"""The mask of an action whose microbatch had no forward on the hook (nothing frozen)."""


def _keep(known: dict, key, value) -> None:
    """``known[key] = value``, ``known`` emptied first when it holds :data:`_KNOWN_SETS` entries."""
    if len(known) >= _KNOWN_SETS:
        known.clear()
    known[key] = value


class FreezingHook:
    """Stage-hook listener applying ``method``'s choices; one instance per rank."""

    def __init__(
        self,
        views: list[StageView],
        method: FreezeMethod,
        get_step: Callable[[], int],
        get_accum: Callable[[], int] = lambda: 0,
        pairs: dict[str, str] | None = None,
        *,
        num_microbatches: int,
        draw_ahead: bool = False,
    ):
        self.views = {v.stage: v for v in views}
        self.names = ActionNames(pairs)
        """Every call's action name, and its DualPipeV pair's (``planner.schedule.actions.part_owners``): a pair's
        backward part records its ratio under the pair's name (its forward part only draws the masks of its own
        microbatch)."""
        self.method = method
        self.get_step = get_step
        self.get_accum = get_accum
        self._numel = {v.stage: {n: p.numel() for n, p in v.params.items()} for v in views}
        """Per stage, every tensor's element count (read once: a draw's ratio sums them)."""
        self._index = {v.stage: {n: i for i, n in enumerate(v.params)} for v in views}
        """Per stage, every tensor's place in registration order (a draw is handed on in that order)."""
        self._total = {s: sum(numel.values()) for s, numel in self._numel.items()}
        self.switch = {v.stage: ParamSwitch(v.module, v.params) for v in views}
        """Per stage: sets ``requires_grad`` on the tensors the stage computes with (FSDP2 included)."""
        self.num_microbatches = num_microbatches
        """Microbatches per batch: after a stage's that many backwards (B or W) every tensor of it is on again."""
        self._left = dict.fromkeys(self.views, num_microbatches)
        """Per stage, the backwards of the batch still to end."""
        self.draw_ahead = num_microbatches if draw_ahead and method.masks_fixed_in_batch else 0
        """Microbatches per batch whose masks are drawn at once, by :meth:`prepare` or else by the batch's first forward
        (0: each forward draws its own)."""
        self._ahead: dict[tuple[int, int], Mask] = {}
        self._ahead_of: tuple[int, int] | None = None
        """The (step, accumulation batch) whose masks ``_ahead`` holds."""
        self._ordered_of: dict[int, dict[frozenset[str], tuple[str, ...]]] = {s: {} for s in self.views}
        """Per stage, :meth:`draw`'s tensors of each set a method handed over lately, and ``_mask_of`` the mask of
        each of those (up to :data:`_KNOWN_SETS` each): a plan's microbatches at ratio 0 or 1 draw the empty set and
        the stage's every tensor, step after step."""
        self._mask_of: dict[int, dict[tuple[str, ...], Mask]] = {s: {} for s in self.views}
        self._lock = threading.Lock()
        self._masks: dict[tuple[int, int], Mask] = {}
        """The mask of every (stage, microbatch) whose forward ran and whose backward has not ended."""
        self._done: list[tuple[int, str, int, Mask]] = []
        """(stage, kind, microbatch, mask) of every B/W action ended since :attr:`applied` was last read: all an
        action's end records during the step (a list's append is atomic, from either of a pair's threads)."""
        self._applied: dict[str, list[tuple[float, int]]] = {}

    @property
    def applied(self) -> dict[str, list[tuple[float, int]]]:
        """(applied ratio = frozen elements / stage's trainable elements, frozen tensor count) of every
        B/W action of the current step, by action name (a DualPipeV pair's under the pair's), one entry per
        gradient-accumulation batch in the order they ran."""
        done, self._done = self._done, []
        for stage, kind, microbatch, (frozen, ratio, _) in done:
            name, pair = self.names.of(stage, kind, microbatch)
            self._applied.setdefault(pair or name, []).append((ratio, len(frozen)))
        return self._applied

    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        if kind == "F":
            mask = self._masks[(stage, microbatch)] = self._mask(self.get_step(), stage, microbatch, self.get_accum())
        else:
            mask = self._masks.get((stage, microbatch), _NO_MASK)
        self.switch[stage].move(mask[2])

    def prepare(self, step: int, accum: int) -> None:
        """Accumulation batch ``accum`` of ``step`` is about to run: with ``draw_ahead``, draw its masks now, before
        the pipeline starts (a rank after the first waits there for its first input anyway; without this call the
        batch's first forward draws them)."""
        if self.draw_ahead and self._ahead_of != (step, accum):
            self._draw_batch(step, accum)

    def _draw_batch(self, step: int, accum: int) -> None:
        with self._lock:  # (DualPipeV's overlap callback may run a pair's parts in two threads)
            if self._ahead_of != (step, accum):
                every = [(s, mb) for s in self.views for mb in range(self.draw_ahead)]
                self._ahead = {key: self._drawn(step, *key, accum) for key in every}
                self._ahead_of = (step, accum)

    def _mask(self, step: int, stage: int, microbatch: int, accum: int) -> Mask:
        """(``draw``, ``ratio_of``) of one forward; with ``draw_ahead``, taken from the batch's masks drawn at once."""
        if self.draw_ahead:
            if self._ahead_of != (step, accum):
                self._draw_batch(step, accum)
            mask = self._ahead.get((stage, microbatch))
            if mask is not None:
                return mask
        return self._drawn(step, stage, microbatch, accum)

    def _drawn(self, step: int, stage: int, microbatch: int, accum: int) -> Mask:
        frozen = self.draw(step, stage, microbatch, accum)
        known = self._mask_of[stage]
        mask = known.get(frozen)
        if mask is None:
            mask = (frozen, self.ratio_of(stage, frozen), self.switch[stage].bits(frozen))
            _keep(known, frozen, mask)
        return mask

    def draw(self, step: int, stage: int, microbatch: int, accum: int = 0) -> tuple[str, ...]:
        """The tensors the method leaves out of ``microbatch`` on ``stage`` (the anchor kept where the method
        may not freeze it), in registration order: the same on every rank."""
        names = self.method.frozen_tensors(step, stage, microbatch, accum=accum)
        if type(names) is not frozenset:
            return self._ordered(stage, names)
        known = self._ordered_of[stage]
        frozen = known.get(names)
        if frozen is None:
            frozen = self._ordered(stage, names)
            _keep(known, names, frozen)
        return frozen

    def _ordered(self, stage: int, names) -> tuple[str, ...]:
        """A method's set of tensors as :meth:`draw` hands it on: without the anchor where the method may not freeze
        it, in registration order."""
        anchor = self.views[stage].anchor
        if anchor is not None and anchor in names and not self.method.may_freeze_anchor:
            names = names - {anchor}
        index = self._index[stage]
        return tuple(sorted(index.keys() & names, key=index.__getitem__))

    def ratio_of(self, stage: int, frozen: tuple[str, ...]) -> float:
        """Frozen elements / the stage's trainable elements."""
        return sum(map(self._numel[stage].__getitem__, frozen)) / max(1, self._total[stage])

    def ratio_total(self, stage: int) -> int:
        """The stage's trainable elements (the denominator of :meth:`ratio_of`)."""
        return self._total[stage]

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        if kind == "B" or kind == "W":
            self._done.append((stage, kind, microbatch, self._masks.pop((stage, microbatch), _NO_MASK)))
            self.backward_ended(stage)

    def backward_ended(self, stage: int) -> None:
        """A microbatch's backward (B or W) ended on ``stage``: after the batch's last, every tensor is on again."""
        left = self._left[stage] - 1
        if left > 0:
            self._left[stage] = left
        else:
            self._stage_on(stage)

    def end_step(self) -> dict[str, list[tuple[float, int]]]:
        """(ratio, tensor count) of the step's backward actions, per accumulation batch; resets the state (every
        tensor on, where a batch stopped short of its last backward)."""
        out = self.applied
        self._applied = {}
        self._ahead, self._ahead_of = {}, None
        self._masks.clear()
        self.all_on()
        return out

    def all_on(self) -> None:
        """Every tensor on and every stage's batch count back at its start: the state between batches (``end_step``;
        the runtime's ``detach_hooks``, so that a batch an exception broke leaves no flag off once the hooks are
        off)."""
        for stage in self.switch:
            self._stage_on(stage)

    def _stage_on(self, stage: int) -> None:
        """Every tensor of ``stage`` on, and its batch count back at its start."""
        self.switch[stage].move(0)
        self._left[stage] = self.num_microbatches

    def freezable_tensors(self) -> dict[int, int]:
        """Number of tensors each local stage can freeze (all trainable tensors but the anchor, unless the method
        may freeze it)."""
        keep = not self.method.may_freeze_anchor
        return {s: len(v.params) - (v.anchor is not None and keep) for s, v in self.views.items()}
