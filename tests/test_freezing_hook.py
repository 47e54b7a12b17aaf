"""The freezing hook under gradient accumulation: every accumulation batch of a step draws its own
masks, and the applied ratios of all batches are kept, not only the last one's."""

from __future__ import annotations

import torch

from tests.test_timely_method import PH, make
from timelyfreeze.hooks.freezing import FreezingHook
from timelyfreeze.methods.selection import action_generator, balanced_subset


def run_step(hook: FreezingHook, accum_box: list[int], batches: int, step_box: list[int], step: int):
    step_box[0] = step
    for b in range(batches):
        accum_box[0] = b
        for mb in range(4):
            hook.before_action(0, "F", mb)
            hook.after_action(0, "F", mb)
            hook.before_action(0, "B", mb)
            hook.after_action(0, "B", mb)
    return hook.end_step()


def planned_hook(ratio: float):
    """A TimelyFreeze method with ``ratio`` planned for every backward of stage 0, its view, and a hook
    reading the step and accumulation batch from the two returned one-element lists."""
    m = make()
    m.set_plan({f"0B{mb}": ratio for mb in range(4)})
    view = m.ctx.stages[0]
    accum, step = [0], [0]
    return m, view, FreezingHook([view], m, lambda: step[0], lambda: accum[0], num_microbatches=4), accum, step


def test_each_accumulation_batch_draws_its_own_masks():
    m, view, hook, accum, step = planned_hook(0.5)
    stable = PH.ramp_end + 1
    applied = run_step(hook, accum, 3, step, stable)
    assert set(applied) == {f"0B{mb}" for mb in range(4)}
    names = [n for n in view.params if n != view.anchor]
    numels = [view.params[n].numel() for n in names]

    def uniform_subset(names, ratio, gen):  # what TimelyFreeze draws
        return balanced_subset(names, numels, ratio, gen)

    for mb in range(4):
        assert len(applied[f"0B{mb}"]) == 3
        for b, (ratio, count) in enumerate(applied[f"0B{mb}"]):
            expect = uniform_subset(names, 0.5, action_generator(0, stable, 0, mb, b))
            assert count == len(expect)
            assert ratio == sum(view.params[n].numel() for n in expect) / sum(p.numel() for p in view.params.values())
        assert m.frozen_tensors(stable, 0, mb, accum=1) == uniform_subset(
            names, 0.5, action_generator(0, stable, 0, mb, 1)
        )
    # the batches of a step draw differently (deterministic: fixed seeds) ...
    assert any(
        len({uniform_subset(names, 0.5, action_generator(0, stable, 0, mb, b)) for b in range(3)}) > 1
        for mb in range(4)
    )
    # ... and batch 0 keeps the seed of a run without accumulation: blake2b("seed/step/stage/mb")
    import hashlib

    digest = hashlib.blake2b(f"0/{stable}/0/2".encode(), digest_size=8).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF)
    assert m.frozen_tensors(stable, 0, 2) == uniform_subset(names, 0.5, g)


def test_flags_are_restored_after_every_batch():
    m, view, hook, accum, step = planned_hook(1.0)
    run_step(hook, accum, 2, step, PH.ramp_end + 1)
    assert all(p.requires_grad for p in view.params.values())
    assert isinstance(next(iter(view.params.values())), torch.nn.Parameter)


def test_a_draw_is_the_methods_choice_in_registration_order():
    m, view, hook, accum, step = planned_hook(0.6)
    stable = PH.ramp_end + 1
    for mb in range(4):
        chosen = m.frozen_tensors(stable, 0, mb) - {view.anchor}
        drawn = hook.draw(stable, 0, mb)
        assert drawn == tuple(n for n in view.params if n in chosen)
        assert hook.ratio_of(0, drawn) == sum(view.params[n].numel() for n in drawn) / sum(
            p.numel() for p in view.params.values()
        )


def test_drawing_a_batch_ahead_applies_the_same_masks():
    """With ``draw_ahead`` the batch's first forward draws every microbatch's masks at once: the same masks,
    switched around the same actions, recorded the same, and drawn once per (step, accumulation batch)."""
    runs = []
    for ahead in (0, 4):
        m = make()
        m.set_plan({f"0B{mb}": 0.1 + 0.2 * mb for mb in range(4)})
        view = m.ctx.stages[0]
        accum, step = [0], [0]
        hook = FreezingHook([view], m, lambda: step[0], lambda: accum[0], num_microbatches=4, draw_ahead=bool(ahead))
        calls = []
        draw = hook.draw
        hook.draw = lambda *a: calls.append(a) or draw(*a)
        seen = []
        for s in (PH.ramp_end, PH.ramp_end + 1):
            step[0] = s
            for b in range(2):
                accum[0] = b
                for mb in range(4):
                    hook.before_action(0, "F", mb)
                    seen.append(tuple(n for n, p in view.params.items() if not p.requires_grad))
                    hook.after_action(0, "F", mb)
                    hook.before_action(0, "B", mb)
                    seen.append(tuple(n for n, p in view.params.items() if not p.requires_grad))
                    hook.after_action(0, "B", mb)
            seen.append(hook.end_step())
        runs.append((seen, sorted(calls)))
    assert runs[0] == runs[1]
    assert any(len(x) for x in runs[0][0] if isinstance(x, tuple))


def test_draw_ahead_waits_for_a_method_whose_masks_may_change_in_a_batch():
    m = make()
    assert FreezingHook(m.ctx.stages, m, lambda: 1, num_microbatches=4, draw_ahead=True).draw_ahead == 4
    m.masks_fixed_in_batch = False
    assert FreezingHook(m.ctx.stages, m, lambda: 1, num_microbatches=4, draw_ahead=True).draw_ahead == 0


def test_every_action_runs_with_its_microbatchs_set_off_and_the_batch_ends_with_every_tensor_on():
    """F, I, W and B of a microbatch each run with exactly that microbatch's drawn set off (B and W as I: a tensor of
    the set is in none of the microbatch's graph, and checkpointed blocks recompute with the forward's flags); between
    two actions the flags stay as the first left them; after the stage's last backward of the batch (the fourth B or W
    here) every tensor is on again, and ``end_step`` puts every tensor on whatever ran."""
    m, view, hook, accum, step = planned_hook(0.6)
    step[0] = PH.ramp_end + 1

    def off():
        return {n for n, p in view.params.items() if not p.requires_grad}

    sets = {}
    order = [("F", 0), ("F", 1), ("I", 0), ("W", 0), ("F", 2), ("B", 1), ("F", 3), ("I", 2), ("B", 3), ("W", 2)]
    for i, (kind, mb) in enumerate(order):
        hook.before_action(0, kind, mb)
        if kind == "F":
            sets[mb] = set(hook.draw(step[0], 0, mb))
        assert off() == sets[mb], (kind, mb)
        assert hook.switch[0].off == hook.switch[0].bits(sets[mb])
        hook.after_action(0, kind, mb)
        if i < len(order) - 1:
            assert off() == sets[mb], (kind, mb)  # left as it is until the next action
    assert all(sets.values()) and len({frozenset(x) for x in sets.values()}) > 1  # the test switched something
    assert not off() and hook.switch[0].off == 0
    for reset in (hook.end_step, hook.all_on):  # a batch stopped short of its last backward (``all_on``: the runtime
        hook.before_action(0, "F", 0)  # calls it when it takes the hooks off, as after an exception)
        assert off() and hook._left[0] == 4
        hook.after_action(0, "B", 0)
        assert off() == sets[0] and hook._left[0] == 3
        reset()
        assert not off() and hook.switch[0].off == 0 and hook._left[0] == 4


def test_prepare_draws_the_batch_before_its_first_forward():
    """``prepare`` (the runtime's ``begin_batch``) draws every microbatch's masks of the batch before the pipeline
    runs; the forwards then take those, the same masks a forward draws for itself, and draw nothing more."""
    seen = []
    for prepared in (False, True):
        m = make()
        m.set_plan({f"0B{mb}": 0.1 + 0.2 * mb for mb in range(4)})
        view = m.ctx.stages[0]
        accum, step = [0], [PH.ramp_end + 1]
        hook = FreezingHook([view], m, lambda: step[0], lambda: accum[0], num_microbatches=4, draw_ahead=True)
        calls = []
        draw = hook.draw
        hook.draw = lambda *a: calls.append(a) or draw(*a)
        masks = []
        for b in range(2):
            accum[0] = b
            if prepared:
                hook.prepare(step[0], b)
                assert len(calls) == 4 * (b + 1)  # the whole batch, before any forward
            for mb in range(4):
                hook.before_action(0, "F", mb)
                masks.append(tuple(n for n, p in view.params.items() if not p.requires_grad))
                hook.after_action(0, "F", mb)
            assert len(calls) == 4 * (b + 1)
        seen.append((masks, sorted(calls)))
    assert seen[0] == seen[1] and any(seen[0][0])


def test_a_set_drawn_again_gives_the_same_mask_as_a_fresh_one():
    """The hook keeps the masks of the sets a method hands over (a plan at ratio 0 or 1 hands the same ones step
    after step): each equals the one made from the set afresh, past the bound of kept sets too; and TimelyFreeze's
    draw at ratio 1 is the balanced draw's (every unit) without seeding a generator."""
    import timelyfreeze.hooks.freezing as freezing

    m = make()
    m.set_plan({f"0B{mb}": (0.0, 1.0, 0.5, 0.25)[mb] for mb in range(4)})
    view = m.ctx.stages[0]
    hook = FreezingHook([view], m, lambda: 0, num_microbatches=4)
    names = [n for n in view.params if n != view.anchor]
    numels = [view.params[n].numel() for n in names]
    for step in range(PH.ramp_end + 1, PH.ramp_end + 1 + 2 * freezing._KNOWN_SETS):
        for mb in range(4):
            got = hook._drawn(step, 0, mb, 0)
            fresh = hook._ordered(0, m.frozen_tensors(step, 0, mb))
            assert got == (fresh, hook.ratio_of(0, fresh), hook.switch[0].bits(fresh))
            assert got[0] == hook.draw(step, 0, mb)
        assert len(hook._ordered_of[0]) <= freezing._KNOWN_SETS and len(hook._mask_of[0]) <= freezing._KNOWN_SETS
        gen = action_generator(0, m.mask_step(step), 0, 1)
        assert m.select(step, 0, 1, 1.0) == m._units[0].balanced(1.0, gen) == balanced_subset(names, numels, 1.0, gen)
