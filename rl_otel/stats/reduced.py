"""A reduced round's results, read on the host after the call's one transfer (:meth:`Fused.read`).

:meth:`Rows.reduce <rl_otel.stats.fused.Rows.reduce>` returns a :class:`Reduced`: the parts its reductions
registered (:mod:`rl_otel.stats.reduce`) and the reads of them in float64 by row name: per-sequence sums, totals,
sums of sequence means, sums of squares, extremes, squared deviations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rl_otel.stats.fused import Fused, Layout


class Reduced:
    """What one round reduced, read by row name after :meth:`Fused.read` (the round's storage is reused by then:
    only the parts are read)."""

    # parts (indices into Fused.host) the reduction registers; unset (AttributeError) where the round has none
    mx: int  # maxima, then minima: of the ``mm`` slots
    mn: int
    rs: int  # compact: the rows' totals; then their per-sequence sums
    seq: int
    m2_part: int  # norms of the ``var`` rows' deviations from their means

    def __init__(self, f: Fused, layout: Layout, slot_rows: dict[int, int] | None, offset: int, sums_part: int,
                 per_seq: Sequence[str], var: Sequence[str]) -> None:
        self.f, self.tok = f, f.tokens
        self.pos = layout.pos
        self._slot_kind, self._counts, self._starts = layout.slot_kind, layout.counts, layout.starts
        self._mm_slots, self._size = layout.mm_slots, layout.size
        self._slot_rows, self._offset, self._sums_part = slot_rows, offset, sums_part
        self.per_seq_rows = frozenset(per_seq)
        self.var = list(var)
        self.sq: dict[str, int] = {}  # row -> part of its sums of squares (masked: their square roots)
        self._sums: np.ndarray | None = None
        self._totals: np.ndarray | None = None

    def _kind(self, name: str) -> int:
        return self._slot_kind[self.pos[name]]

    def per_seq(self, name: str) -> np.ndarray:
        """Per-sequence sums ``[B]`` (float64; on the compact layout, of the rows reduced with ``per_seq``)."""
        if self.tok.compact:
            if name in self._counts:
                return self.f.counts(self._kind(name))
            if name not in self.per_seq_rows:
                raise KeyError(f"row {name!r} was not reduced per sequence: reduce(per_seq=[{name!r}, ...])")
        return self._host_sums()[self._host_row(name)]

    def _host_row(self, name: str) -> int:
        """The row's index in what the reductions read back: its storage row (compact), its slot (masked)."""
        slot = self.pos[name]
        return slot if self._slot_rows is None else self._slot_rows[slot]

    def _host_sums(self) -> np.ndarray:
        if self._sums is None:
            b = self.tok.shape[0]
            if self.tok.compact:
                seq = self.f.host[self.seq]
                self._sums = seq.astype(np.float64).reshape(-1, b) if b else np.zeros((len(self.f.host[self.rs]), 0))
            else:
                end = self._offset + self._size
                sums = self.f.host64(self._sums_part).reshape(-1, b) if b else np.zeros((end, 0))
                self._sums = sums[self._offset:end]
        return self._sums

    def total(self, name: str) -> float:
        if name in self._counts:
            return float(self.per_seq(name).sum())
        if self._totals is None:
            self._totals = (self.f.host[self.rs].astype(np.float64) if self.tok.compact
                            else self._host_sums().sum(1))
        return float(self._totals[self._host_row(name)])

    def seq_sum(self, name: str) -> float:
        """Sum over the sequences that have tokens of the row's kind of each one's mean (the others add 0)."""
        return float(self.per_seq(name) @ self.f.inverse_counts(self._kind(name)))

    def sq_per_seq(self, name: str) -> np.ndarray:
        """Per-sequence sums of the row's squares (float64)."""
        x = self.f.host[self.sq[name]].astype(np.float64)
        return x if self.tok.compact else np.square(x)

    def sq_total(self, name: str) -> float:
        return float(self.sq_per_seq(name).sum())

    def sq_seq_sum(self, name: str) -> float:
        """:meth:`seq_sum` of the row's squares."""
        return float(self.sq_per_seq(name) @ self.f.inverse_counts(self._kind(name)))

    def _mm(self, name: str, part: int) -> float:
        if self.tok.compact:
            return float(self.f.host[part][self._host_row(name)])
        slot = self.pos[name]
        kind = self._slot_kind[slot]
        return float(self.f.host[part][kind * len(self._mm_slots) + self._mm_slots.index(slot - self._starts[kind])])

    def max(self, name: str) -> float:
        """Over the row's tokens; NaN when there are none."""
        return self._mm(name, self.mx) if self.f.n(self._kind(name)) else math.nan

    def min(self, name: str) -> float:
        return self._mm(name, self.mn) if self.f.n(self._kind(name)) else math.nan

    def m2(self, name: str) -> float:
        """Sum of squared deviations from the mean of a ``var`` row."""
        return float(self.f.host[self.m2_part][self.var.index(name)]) ** 2
