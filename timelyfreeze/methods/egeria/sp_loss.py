"""Egeria's plasticity math: the similarity-preserving (SP) loss between a training activation and its
reference activation, and the least-squares slope the controller reads off the smoothed plasticity.

Pure functions of tensors / lists of floats; no state, no threads.
"""

import torch
import torch.nn.functional as F


def _rows(a: torch.Tensor) -> torch.Tensor:
    """Activation -> rows compared by the SP loss: (batch, seq, d) -> (batch*seq, d) token vectors;
    anything else -> (batch, rest) as in the paper (b x chw for images)."""
    if a.dim() == 3:
        return a.reshape(-1, a.shape[-1])
    if a.dim() == 1:
        return a.reshape(-1, 1)
    return a.reshape(a.shape[0], -1)


def sp_loss(a_t: torch.Tensor, a_r: torch.Tensor, max_rows: int = 0) -> float:
    """Similarity-preserving loss (Tung & Mori; KGT App. B): Q = rows of A, G = row-L2-normalised Q Q^T,
    loss = ||G_T - G_R||_F^2 / b^2. ``max_rows`` > 0 keeps that many evenly spaced rows."""
    qt, qr = _rows(a_t.detach()).float(), _rows(a_r.detach()).float()
    if qt.shape != qr.shape:
        raise ValueError(f"activation shapes differ: {tuple(a_t.shape)} vs {tuple(a_r.shape)}")
    b = qt.shape[0]
    if max_rows > 0 and b > max_rows:
        idx = torch.linspace(0, b - 1, max_rows).round().long()
        qt, qr, b = qt[idx], qr[idx], max_rows
    gt = F.normalize(qt @ qt.T, p=2, dim=1)
    gr = F.normalize(qr @ qr.T, p=2, dim=1)
    return float((gt - gr).pow(2).sum().item()) / (b * b)


def linear_slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (0 for fewer than two points)."""
    n = len(ys)
    if n < 2:
        return 0.0
    xm = (n - 1) / 2.0
    ym = sum(ys) / n
    sxx = sum((i - xm) ** 2 for i in range(n))
    return sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sxx
