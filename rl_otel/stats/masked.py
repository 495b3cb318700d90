"""Masked reductions that stay on the device and never count padding, even NaN padding.

Every function returns a 0-d tensor (no host sync); an empty selection gives NaN. Inputs are expected in
float32 or float64 (see :func:`rl_otel.stats.histogram.as_float`); ``mask`` is a bool tensor of the same shape.
"""

from __future__ import annotations

import torch

_NAN = float("nan")


def count(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(dtype=torch.float32) if mask.dtype == torch.bool else mask.float().sum()


def total(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the selected values (``torch.where``, not ``x * mask``: NaN in padding stays out)."""
    return torch.where(mask, x, 0.0).sum()


def mean(x: torch.Tensor, mask: torch.Tensor, n: torch.Tensor | None = None) -> torch.Tensor:
    n = count(mask) if n is None else n
    return total(x, mask) / n.to(x.dtype)  # 0/0 = NaN for an empty selection


def var(x: torch.Tensor, mask: torch.Tensor, n: torch.Tensor | None = None, *, unbiased: bool = False
        ) -> torch.Tensor:
    """Two-pass variance of the selected values (population; ``unbiased``: Bessel-corrected, NaN below 2)."""
    n = (count(mask) if n is None else n).to(x.dtype)
    mu = total(x, mask) / n
    ss = torch.where(mask, (x - mu) ** 2, 0.0).sum()
    if unbiased:
        return torch.where(n > 1, ss / (n - 1), _NAN)
    return ss / n


def maximum(x: torch.Tensor, mask: torch.Tensor, n: torch.Tensor | None = None) -> torch.Tensor:
    if x.numel() == 0:
        return torch.tensor(_NAN, dtype=x.dtype, device=x.device)
    n = count(mask) if n is None else n
    return torch.where(n > 0, torch.where(mask, x, -torch.inf).max(), _NAN)


def minimum(x: torch.Tensor, mask: torch.Tensor, n: torch.Tensor | None = None) -> torch.Tensor:
    if x.numel() == 0:
        return torch.tensor(_NAN, dtype=x.dtype, device=x.device)
    n = count(mask) if n is None else n
    return torch.where(n > 0, torch.where(mask, x, torch.inf).min(), _NAN)


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over sequences (rows with at least one selected token) of each row's masked token mean."""
    per_row_n = mask.sum(-1, dtype=x.dtype)
    has = per_row_n > 0
    row_means = torch.where(mask, x, 0.0).sum(-1) / per_row_n.clamp(min=1)
    return mean(row_means, has)


def total_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row sum of the selected values (``[B, T]`` -> ``[B]``)."""
    return torch.where(mask, x, 0.0).sum(-1)
