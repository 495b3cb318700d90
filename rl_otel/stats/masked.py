"""Reductions over a batch's response tokens that stay on the device and never count padding, even NaN padding.

Every reduction returns a 0-d tensor (no host sync); an empty selection gives NaN. Inputs are expected in
float32 or float64 (see :func:`rl_otel.stats.histogram.as_float`).
"""

from __future__ import annotations

import torch

_NAN = float("nan")


def count(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(dtype=torch.float32) if mask.dtype == torch.bool else mask.float().sum()


class Selection:
    """The response tokens of a ``[B, T]`` batch, and reductions over them that never sync with the device.

    On the CPU the tokens are compacted once (an index of the mask's nonzeros; every input is gathered to a
    1-d tensor of the selected tokens, so later elementwise work and reductions touch only those). On an
    accelerator that index would cost a device sync, so inputs stay full-size and every reduction masks with
    ``torch.where`` instead. Both paths give the same numbers; ``compact`` forces one (tests run both on CPU).
    """

    def __init__(self, mask: torch.Tensor, compact: bool | None = None) -> None:
        self.mask = mask.detach().bool()
        self.shape = tuple(self.mask.shape)
        self.flat = self.mask.reshape(-1)
        self.compact = self.mask.device.type == "cpu" if compact is None else compact
        self.row_counts = self.mask.sum(-1)
        self.n = self.row_counts.sum(dtype=torch.float32) if self.mask.dim() else count(self.mask)
        if self.compact:
            self.index = self.flat.nonzero().squeeze(1)
        self._rows: torch.Tensor | None = None

    @property
    def rows(self) -> torch.Tensor:
        """The sequence (row) of each selected token (compact path only; computed when first needed)."""
        if self._rows is None:
            self._rows = self.index // self.shape[-1] if self.shape[-1] else self.index
        return self._rows

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as a 1-d tensor over the tokens: the selected ones (compact) or all of them (masked)."""
        x = x.detach().reshape(-1)
        return x.index_select(0, self.index) if self.compact else x

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """Only the selected values of a :meth:`take` result (a boolean index, so a sync on an accelerator)."""
        return x if self.compact else x[self.flat]

    @property
    def dist_mask(self) -> torch.Tensor | None:
        """The mask :func:`~rl_otel.stats.histogram.bucket_vector` needs for a :meth:`take` result."""
        return None if self.compact else self.flat

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        if v.dtype == torch.bool:  # a flag: count it
            return torch.count_nonzero(v if self.compact else v & self.flat)
        return v.sum() if self.compact else torch.where(self.flat, v, 0).sum()

    def mean(self, v: torch.Tensor) -> torch.Tensor:
        s = self.sum(v)
        return s / self.n.to(s.dtype if s.is_floating_point() else torch.float32)

    def var(self, v: torch.Tensor, *, unbiased: bool = False) -> torch.Tensor:
        n = self.n.to(v.dtype)
        dev = (v - self.sum(v) / n).square()
        ss = self.sum(dev)
        if unbiased:
            return torch.where(n > 1, ss / (n - 1), _NAN)
        return ss / n

    def min_max(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if v.numel() == 0:
            nan = torch.tensor(_NAN, dtype=v.dtype, device=v.device)
            return nan, nan
        if self.compact:
            lo, hi = torch.aminmax(v)
            return lo, hi
        lo = torch.where(self.flat, v, torch.inf).min()
        hi = torch.where(self.flat, v, -torch.inf).max()
        return torch.where(self.n > 0, lo, _NAN), torch.where(self.n > 0, hi, _NAN)

    def row_sums(self, v: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums ``[B]`` of a :meth:`take` result."""
        dtype = v.dtype if v.is_floating_point() else torch.float32
        if self.compact:
            return torch.zeros(self.shape[0], dtype=dtype).index_add_(0, self.rows, v.to(dtype))
        return torch.where(self.flat, v, 0).to(dtype).reshape(self.shape).sum(-1)

    def seq_mean(self, v: torch.Tensor) -> torch.Tensor:
        """Mean over sequences with at least one token of each sequence's token mean (ROLL's seq-mean-token-mean)."""
        sums = self.row_sums(v)
        has = self.row_counts > 0
        row_means = sums / self.row_counts.clamp(min=1).to(sums.dtype)
        return torch.where(has, row_means, 0.0).sum() / has.sum().to(sums.dtype)
