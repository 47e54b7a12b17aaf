"""SmartPipe (Niknami, Sawwan, Wu) as a step-level prefix-freezing baseline."""

from dataclasses import dataclass


@dataclass
class SmartPipeConfig:
    tau: float = 1.0
    """tau: a layer may freeze when its gradient-norm difference ||g(t-1) - g(t)|| / ||g(t-1)|| is below this.
    Not stated in the paper (digest 3.5/6); 1.0 is our choice: with noise-dominated minibatch gradients
    the ratio sits near sqrt(2), and it drops below 1 only when consecutive gradients clearly agree."""
    lam: float = 0.25
    """lambda: freezing rate, at most this fraction of the remaining active layers freezes per check (at
    least one, so freezing can progress). The paper only constrains it to (0, 1) (digest 3.2/6); 0.25 is our
    "conservative" choice."""
    e1: int = 0
    """Warm-up steps without freezing (the paper's e1, not stated there); freezing starts after
    max(freeze.warmup_steps, e1)."""
    check_every: int = 10
    """Steps between gradient collections/checks ("regular time intervals t", value not stated in the paper;
    10 matches the other baselines' check frequency)."""
