"""Reductions over a batch's response tokens that stay on the device and never count padding, even NaN padding.

Every reduction returns a 0-d tensor (no host sync); an empty selection gives NaN, or the value a reduction is
asked to give (as a framework's own definition does). Inputs are expected in float32 or float64 (see
:func:`rl_otel.stats.histogram.as_float`).
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
        # int32 counts: a bool sum otherwise widens the whole mask to int64 first (6x the time)
        self.row_counts = self.mask.sum(-1, dtype=torch.int32) if self.mask.dim() else self.mask.sum()
        self.n = self.row_counts.sum(dtype=torch.float32) if self.mask.dim() else count(self.mask)
        if self.compact:
            # int32 positions (half the memory of nonzero's int64, and a faster gather) while they fit
            index = self.flat.nonzero().squeeze(1)
            self.index = index.to(torch.int32) if self.flat.numel() < 2**31 else index
        self._stats: dict[int | None, list] = {}
        self._index: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

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
        dev = (v - self.sum(v) / n).square_()  # two passes (exact enough in float32), one temporary
        ss = self.sum(dev)
        if unbiased:
            return torch.where(n > 1, ss / (n - 1), _NAN)
        return ss / n

    def take_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """Another ``[B, T]`` mask as a boolean :meth:`take` result: its positions inside this selection (a
        sub-selection; positions outside the selection are dropped)."""
        m = self.take(mask).bool()
        return m if self.compact else m & self.flat

    def min_max(self, v: torch.Tensor, within: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Min and max of the selected values (of the sub-selection ``within``, a :meth:`take_mask` result); NaN
        for an empty selection."""
        if v.numel() == 0:
            nan = torch.tensor(_NAN, dtype=v.dtype, device=v.device)
            return nan, nan
        if within is not None:
            lo = torch.where(within, v, torch.inf).min()
            hi = torch.where(within, v, -torch.inf).max()
            some = torch.count_nonzero(within) > 0
            return torch.where(some, lo, _NAN), torch.where(some, hi, _NAN)
        if self.compact:
            lo, hi = torch.aminmax(v)
            return lo, hi
        lo = torch.where(self.flat, v, torch.inf).min()
        hi = torch.where(self.flat, v, -torch.inf).max()
        return torch.where(self.n > 0, lo, _NAN), torch.where(self.n > 0, hi, _NAN)

    def sum_min_max(self, v: torch.Tensor, within: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sum, min and max of the selected values (of the sub-selection ``within``, a :meth:`take_mask` result);
        min and max NaN for an empty selection. Compact: the sub-selection is gathered once (its index cached) and
        reduced twice, instead of three masked passes."""
        if within is None or not self.compact:
            lo, hi = self.min_max(v, within)
            return self.sum(v if within is None else torch.where(within, v, 0.0)), lo, hi
        sub = v.index_select(0, self._index_of(within))
        if sub.numel() == 0:
            nan = torch.tensor(_NAN, dtype=v.dtype, device=v.device)
            return sub.sum(), nan, nan
        lo, hi = torch.aminmax(sub)
        return sub.sum(), lo, hi

    def _index_of(self, within: torch.Tensor) -> torch.Tensor:
        """The positions of a compact sub-selection (cached per ``within``, kept alive with its entry)."""
        hit = self._index.get(id(within))
        if hit is None:
            index = within.nonzero().squeeze(1)
            hit = self._index[id(within)] = (within, index.to(torch.int32) if within.numel() < 2**31 else index)
        return hit[1]

    def min_max_fill(self, v: torch.Tensor, lo_fill: float, hi_fill: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Min and max over the whole ``[B, T]`` batch with unselected positions reading ``lo_fill`` (for the
        min) and ``hi_fill`` (for the max): ROLL's ``min(x * m + (1 - m) * 1e10)`` and ``max(x * m)``. NaN for a
        batch with no positions at all."""
        total = self.flat.numel()
        if total == 0:
            nan = torch.tensor(_NAN, dtype=v.dtype, device=v.device)
            return nan, nan
        if not self.compact:
            return torch.where(self.flat, v, lo_fill).min(), torch.where(self.flat, v, hi_fill).max()
        if v.numel() == 0:
            return (torch.tensor(lo_fill, dtype=v.dtype, device=v.device),
                    torch.tensor(hi_fill, dtype=v.dtype, device=v.device))
        lo, hi = torch.aminmax(v)
        if v.numel() == total:
            return lo, hi
        return torch.clamp(lo, max=lo_fill), torch.clamp(hi, min=hi_fill)  # NaN stays NaN, as in torch.min

    def row_sums(self, v: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums ``[B]`` of a :meth:`take` result."""
        dtype = v.dtype if v.is_floating_point() else torch.float32
        if self.compact:
            if v.numel() == 0:
                return torch.zeros(self.shape[0], dtype=dtype)
            # the tokens are in row order: a segmented sum (a quarter of index_add_'s time on a CPU)
            return torch.segment_reduce(v.to(dtype), "sum", lengths=self.row_counts, unsafe=True)
        return torch.where(self.flat, v, 0).to(dtype).reshape(self.shape).sum(-1)

    def row_counts_within(self, within: torch.Tensor | None) -> torch.Tensor:
        """Selected tokens per sequence ``[B]``, of the sub-selection ``within`` if given."""
        return self.row_counts if within is None else self.row_sums(within)

    def per_row(self, x: torch.Tensor) -> torch.Tensor:
        """A per-sequence ``[B]`` tensor broadcast to a :meth:`take` result (each token gets its sequence's value)."""
        if self.compact:
            return x.repeat_interleave(self.row_counts, output_size=int(self.index.numel()))
        return x.unsqueeze(-1).expand(self.shape).reshape(-1)

    def _row_stats(self, within: torch.Tensor | None) -> list:
        """Cached per sub-selection (``within``, or all): ``[within, 1 / token count per sequence (float32 [B]),
        sequences with a token, that count clamped to >= 1, whether it is > 0, per-token weights or None]``."""
        key = None if within is None else id(within)
        hit = self._stats.get(key)
        if hit is None:
            counts = self.row_counts_within(within)
            n = (counts > 0).sum().to(torch.float32)
            # `within` is kept alive with its entry, so its id is not reused while the entry exists
            hit = [within, 1.0 / counts.clamp(min=1).to(torch.float32), n, n.clamp(min=1), n > 0, None]
            self._stats[key] = hit
        return hit

    def _sum_of_row_means(self, v: torch.Tensor, within: torch.Tensor | None) -> tuple[torch.Tensor, list]:
        """The sum over sequences of each one's token mean (of ``within``; a sequence without tokens adds 0), and
        the sub-selection's :meth:`_row_stats`."""
        stats = self._row_stats(within)
        if self.compact:
            # per token 1 / its sequence's count (0 outside `within`): one multiply-and-sum instead of a
            # per-sequence pass (a segmented sum costs four times as much on a CPU)
            if stats[5] is None:
                weight = self.per_row(stats[1])
                stats[5] = weight if within is None else weight.masked_fill_(~within, 0.0)
            if v.dtype == torch.bool:  # a flag: the sum of the flagged tokens' weights
                return torch.where(v, stats[5], 0.0).sum(), stats
            if within is not None:  # NaN outside `within` must not reach the sum: zeroed, then weighted in place
                return torch.where(within, v, 0.0).mul_(stats[5]).sum(), stats
            return (v * stats[5]).sum(), stats
        if v.dtype == torch.bool:
            v = v.float()
        if within is not None:
            v = torch.where(within, v, 0.0)
        return (self.row_sums(v) * stats[1]).sum(), stats  # full-size: one masked reduction over [B, T]

    def seq_mean(self, v: torch.Tensor, within: torch.Tensor | None = None, empty: float = _NAN) -> torch.Tensor:
        """Mean over sequences with at least one token of each sequence's token mean (ROLL's and veRL's
        seq-mean-token-mean), over the sub-selection ``within`` (a :meth:`take_mask` result) if given; ``empty``
        when no sequence has a token (NaN as veRL gives; ROLL divides by ``count + 1e-8`` and gives 0)."""
        total, stats = self._sum_of_row_means(v, within)
        return torch.where(stats[4], total / stats[3], empty)

    def mean_of_row_means(self, v: torch.Tensor) -> torch.Tensor:
        """Mean over all ``B`` sequences of each one's token mean, a sequence without tokens counting 0 (ROLL's
        critic worker: ``masked_mean(x, mask, dim=-1).mean()``); NaN for an empty batch."""
        total, _ = self._sum_of_row_means(v, None)
        return total / self.shape[0]
