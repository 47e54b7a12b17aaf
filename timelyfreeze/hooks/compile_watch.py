"""What ``torch.compile`` did during a run: the graphs Dynamo compiled on this rank, all told and after the
warm-up (which must compile every variant freezing needs: ``docs/compile.md``), and the compiled regions."""

from __future__ import annotations


def graphs_compiled() -> int:
    """Distinct graphs Dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters  # deferred: Dynamo only for compiled runs

    return int(counters["stats"]["unique_graphs"])


def compiled_regions(modules) -> int:
    """Modules under ``modules`` that ``torch.compile`` wrapped (TorchTitan wraps every transformer block)."""
    from torch._dynamo.eval_frame import OptimizedModule  # deferred: Dynamo only for compiled runs

    return sum(isinstance(m, OptimizedModule) for root in modules for m in root.modules())


class CompileWatch:
    """Counts the graphs compiled up to the end of step ``warmup_end`` and after it."""

    def __init__(self, warmup_end: int, modules):
        self.warmup_end = warmup_end
        self.regions = compiled_regions(modules)
        self.at_warmup_end: int | None = None

    def end_step(self, step: int) -> None:
        if step == self.warmup_end:
            self.at_warmup_end = graphs_compiled()

    def stats(self) -> dict:
        """This rank's figures for the summary (``docs/run-outputs.md``)."""
        total = graphs_compiled()
        return {
            "regions": self.regions,
            "graphs": total,
            "graphs_after_warmup": None if self.at_warmup_end is None else total - self.at_warmup_end,
        }
