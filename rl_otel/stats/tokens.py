"""The response tokens of a ``ppo_stats`` batch, and the two kinds of mask a row is reduced over: the response
tokens (``RESP``) or ROLL's final mask within them (``FIN``). :class:`Tokens` holds them in the layout the call
reduces in (see :mod:`rl_otel.stats.fused`): the keep masks (masked layout) or an index of the selected tokens
(compact layout)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

RESP, FIN = 0, 1


def count_name(kind: int) -> str:
    """The name of the row of ones of ``kind``: its sums are the kind's token counts (a section declares it in one
    of its rounds; a variance reads the count of its own section)."""
    return "1" if kind == RESP else "1f"


COUNT_KINDS = {count_name(RESP): RESP, count_name(FIN): FIN}  # count row -> its kind


class Tokens:
    """The response tokens of a ``[B, T]`` batch and, optionally, a sub-selection of them (ROLL's final mask)."""

    def __init__(self, mask: torch.Tensor, final: torch.Tensor | None, compact: bool | None) -> None:
        self.mask = mask.detach()
        self.shape = (int(mask.shape[0]), int(mask.shape[1]))
        self.device = mask.device
        self.compact = self.device.type == "cpu" if compact is None else compact
        if self.compact and self.device.type != "cpu":
            raise ValueError(f"the compact layout reduces CPU tensors, got {self.device.type} tensors")
        self.kinds = 1 if final is None else 2
        if self.compact:
            selected = self.mask.bool()
            # int32 counts and positions: a bool sum otherwise widens the whole mask to int64 first (6x the time);
            # numpy's flatnonzero of the bools: a quarter of torch's nonzero on a CPU
            self.row_counts = selected.sum(-1, dtype=torch.int32)
            index = np.flatnonzero(selected.numpy())
            self.index = torch.from_numpy(index.astype(np.int32) if selected.numel() < 2**31 else index)
            self.size = int(self.index.numel())
            self.fin = None if final is None else self.take(final) != 0
            self._off_fin: np.ndarray | None = None
            self._fin_counts: np.ndarray | None = None
            self._segments: tuple[np.ndarray, np.ndarray | None] | None = None
        else:
            # keep[k]: the positions a row of kind k counts (FIN: within the response tokens); two kernels for two
            # kinds, where dropped-position masks took three
            self.keep = torch.empty((self.kinds, *self.shape), dtype=torch.bool, device=self.device)
            torch.ne(self.mask, 0, out=self.keep[RESP])
            if final is not None:
                torch.logical_and(final.detach(), self.mask, out=self.keep[FIN])
            self.size = self.shape[0] * self.shape[1]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return (self.size,) if self.compact else self.shape

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """A ``[B, T]`` input as a row: its selected tokens (compact) or itself (masked)."""
        x = x.detach()
        return x.reshape(-1).index_select(0, self.index) if self.compact else x

    # -- the compact layout (CPU) ---------------------------------------------------------------------------------

    def off_fin(self) -> np.ndarray:
        """Positions, among the selected tokens, of those outside the FIN mask (compact)."""
        if self._off_fin is None:
            assert self.fin is not None
            self._off_fin = np.flatnonzero(~self.fin.numpy())
        return self._off_fin

    def fin_counts(self) -> np.ndarray:
        """FIN tokens per sequence, ``[B]`` (compact)."""
        if self._fin_counts is None:
            assert self.fin is not None
            self._fin_counts = self.segment_sums(self.fin.numpy().astype(np.float32)[None])[0]
        return self._fin_counts

    def segment_sums(self, rows: np.ndarray, runs: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
        """Per-sequence sums ``[n, B]`` of compact rows ``[n, L]`` (the tokens are in sequence order: numpy's
        segmented sum, a fifth of ``torch.segment_reduce``'s time on a CPU); with ``runs``, only of those
        ``[start, stop)`` rows (the others read 0)."""
        n, b = rows.shape[0], self.shape[0]
        out = np.zeros((n, b), dtype=rows.dtype)
        if not self.size:
            return out
        if self._segments is None:
            sizes = self.row_counts.numpy().astype(np.int64)
            nonempty = sizes > 0  # reduceat offsets: of the sequences with tokens (it has no empty segment)
            self._segments = ((np.cumsum(sizes) - sizes)[nonempty], None if nonempty.all() else nonempty)
        starts, has = self._segments
        with np.errstate(all="ignore"):  # inf/NaN tokens give inf/NaN sums, as torch's, without a warning
            for a, z in [(0, n)] if runs is None else runs:
                if has is None:
                    np.add.reduceat(rows[a:z], starts, axis=1, out=out[a:z])
                else:  # the sequences without tokens sum to 0
                    out[a:z, has] = np.add.reduceat(rows[a:z], starts, axis=1)
        return out
