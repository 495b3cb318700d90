"""A batch's per-token statistics in a few stacked reductions, read back with one host transfer.

``ppo_stats`` writes the per-token quantities it needs (log-ratios, clipped-token flags, losses, the inputs
themselves) as the rows of one buffer, each row tagged with the mask it is reduced over: the response tokens
(``RESP``) or ROLL's final mask within them (``FIN``). A :class:`Rows` round masks and reduces all its rows
together: one masked fill and one ``sum`` give every row's per-sequence sums, two fills and an ``amax``/``amin``
the maxima and minima, so a call launches a few dozen kernels whatever the number of keys (each framework's metric
code launches several per metric and reads each back with its own ``.item()``). Everything reduced is a *part* of
:class:`Fused`, moved to the host at once and read there in float64: the keys' formulas (means, sequence means,
variances, the frameworks' rules for an empty selection) run on ``[rows, B]`` per-sequence sums and a few numbers.

A section plans its rounds first (:meth:`Fused.plan`); they share one buffer, a later round reusing (and reading)
an earlier one's rows by position, so the peak memory is one round's rows plus a few temporaries. The rows have
two layouts:

- masked (``compact=False``, the accelerator path): a row is the whole ``[B, T]`` batch, padding included; a
  round's rows form a ``[kinds, width]`` grid, each kind's rows one block, so the ``[kinds, 1, B, T]`` drop mask
  broadcast over it masks both kinds in one ``masked_fill_``, and ``sum(-1)`` gives ``[rows, B]``. Padding is filled
  before anything is summed: it never counts, even NaN. Count rows (:func:`count_name`) hold ones.
- compact (``compact=True``, the CPU path, CPU tensors only): the response tokens are gathered once (an index of
  the mask: a device sync on an accelerator, free on a CPU) and a row holds the ``L`` selected tokens, so there is
  no padding. A round is reduced on numpy views of its rows (a third of torch's per-call cost on small rows): FIN
  rows are written at the few tokens outside the final mask through an index of them (a boolean fill reads every
  token, 14x the time on a CPU), per-sequence sums are segmented sums of the rows, which are in sequence order.
  Only the positions some round uses get storage (count rows are known counts here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import torch

RESP, FIN = 0, 1

_INF = math.inf


def count_name(kind: int) -> str:
    """The name of the row of ones of ``kind``: its sums are the kind's token counts (declare it in the first
    round of a section that uses the kind)."""
    return "1" if kind == RESP else "1f"


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
            # int32 counts and positions: a bool sum otherwise widens the whole mask to int64 first (6x the time)
            self.row_counts = selected.sum(-1, dtype=torch.int32)
            index = selected.reshape(-1).nonzero().squeeze(1)
            self.index = index.to(torch.int32) if selected.numel() < 2**31 else index
            self.size = int(self.index.numel())
            self.fin = None if final is None else self.take(final) != 0
            self._off_fin: np.ndarray | None = None
            self._fin_counts: np.ndarray | None = None
            self._segments: tuple[np.ndarray, np.ndarray | None] | None = None
        else:
            # drop[k]: the positions a row of kind k never counts (padding; for FIN also what is outside RESP)
            self.drop = torch.empty((self.kinds, *self.shape), dtype=torch.bool, device=self.device)
            torch.eq(self.mask, 0, out=self.drop[RESP])
            if final is not None:
                torch.eq(final.detach(), 0, out=self.drop[FIN])
                self.drop[FIN].logical_or_(self.drop[RESP])
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


class Fused:
    """One ``ppo_stats`` call: its tokens, the rounds' shared storage, and the parts read back in one transfer."""

    def __init__(self, tokens: Tokens, dtype: torch.dtype) -> None:
        self.tokens = tokens
        self.dtype = dtype
        self.parts: list[torch.Tensor | np.ndarray] = []
        self.host: list[np.ndarray] = []
        self.count_rows: dict[int, tuple[Rows, str]] = {}
        self._storage: torch.Tensor | None = None
        self._rows: dict[int, int] = {}  # position -> storage row
        self._open: Rows | None = None
        self._planned: list[Rows] = []
        self._host_counts: dict[int, tuple[np.ndarray, np.ndarray, float, int]] = {}
        if tokens.compact:  # the counts are known
            self._counts = {RESP: self.part(tokens.row_counts)}
            if tokens.kinds > FIN:
                self._counts[FIN] = self.part(tokens.fin_counts())

    def part(self, t: torch.Tensor | np.ndarray) -> int:
        """Register a device tensor to read back (or, on the compact layout, a host array already); returns its
        index into :attr:`host` after :meth:`read`."""
        self.parts.append(t.reshape(-1) if isinstance(t, np.ndarray) else t.detach().reshape(-1))
        return len(self.parts) - 1

    def plan(self, *rounds: Rows) -> None:
        """Storage for a section's rounds, which reuse it in turn (each reads the rows it needs of the one
        before by position). Masked: every position of the largest round; compact: the positions some round
        uses for something else than counts, in order."""
        if self._open is not None:
            raise RuntimeError("a round is still open: reduce() it before planning the next")
        for done in self._planned:  # an earlier section's rounds, reduced: their storage is free to go
            done.unbind()
        self._planned = list(rounds)
        if self.tokens.compact:
            positions = sorted({p for r in rounds for name, p in r.pos.items() if not r.is_count(name)})
            rows = len(positions)
        else:
            positions = list(range(max(r.size for r in rounds)))
            rows = len(positions)
        if self._storage is None or self._storage.shape[0] < rows:
            self._storage = torch.empty((rows, *self.tokens.row_shape), dtype=self.dtype, device=self.tokens.device)
        self._rows = {p: i for i, p in enumerate(positions)}
        for r in rounds:
            r.bind(self._storage, self._rows)

    def close(self) -> None:
        """Drop the storage and the rounds (which refer back to this object): the memory is free when the call
        returns, not when Python's cyclic garbage collector next runs (on a GPU, a round buffer of device memory)."""
        self.count_rows.clear()
        for done in self._planned:
            done.unbind()
        self._planned = []
        self._storage = None
        self.parts.clear()
        self.host = []

    def read(self) -> None:
        """The one device -> host transfer (the compact layout, a CPU's, views each part where it is)."""
        if self.tokens.compact:
            self.read_parts()
        else:
            self.read_at_once()

    def read_parts(self) -> None:
        self.host = [p if isinstance(p, np.ndarray) else p.cpu().numpy() for p in self.parts]

    def read_at_once(self) -> None:
        """One ``cat`` and one copy to the host (``cat`` promotes to the widest dtype: the parts are
        :attr:`dtype`, histograms float64; integers and float32 values convert exactly)."""
        self.host = []
        if not self.parts:
            return
        parts = [torch.from_numpy(p) if isinstance(p, np.ndarray) else p for p in self.parts]
        flat = torch.cat(parts).cpu().numpy()
        pos = 0
        for p in parts:
            self.host.append(flat[pos:pos + p.numel()])
            pos += p.numel()

    def counts(self, kind: int) -> np.ndarray:
        """Tokens of ``kind`` per sequence, ``[B]`` float64 (after :meth:`read`)."""
        return self._counted(kind)[0]

    def inverse_counts(self, kind: int) -> np.ndarray:
        """``1 / counts`` (0 for a sequence without tokens): a sum of per-sequence sums times it is the sum of
        their means."""
        return self._counted(kind)[1]

    def _counted(self, kind: int) -> tuple[np.ndarray, np.ndarray, float, int]:
        hit = self._host_counts.get(kind)
        if hit is None:
            if self.tokens.compact:
                counts = self.host[self._counts[kind]].astype(np.float64)
            else:
                rows, name = self.count_rows[kind]
                counts = rows.per_seq(name)
            has = counts > 0
            inverse = has / np.maximum(counts, 1.0)
            hit = self._host_counts[kind] = (counts, inverse, float(counts.sum()), int(np.count_nonzero(has)))
        return hit

    def n(self, kind: int) -> float:
        """Tokens of ``kind``."""
        return self._counted(kind)[2]

    def n_seqs(self, kind: int) -> int:
        """Sequences with at least one token of ``kind``."""
        return self._counted(kind)[3]


class Rows:
    """One round: named rows of the call's storage, written by the caller, then masked and reduced together.

    ``kinds[k]`` names the rows of kind ``k`` (``None``: an unused slot; position ``k * width + i``); ``tail``
    names rows reduced over all ``T`` positions, unmasked (veRL sums its token-level scores so). ``mm`` selects the
    slots of each kind whose maxima and minima are wanted. Count rows (:func:`count_name`) are filled here.
    """

    def __init__(self, f: Fused, kinds: Sequence[Sequence[str | None]], *, tail: Sequence[str] = (),
                 mm: slice | None = None) -> None:
        tok = f.tokens
        if len(kinds) > tok.kinds:
            raise ValueError(f"{len(kinds)} kinds of rows, the batch has {tok.kinds} masks")
        self.f, self.tok, self.kinds, self.mm = f, tok, len(kinds), mm
        self.width = max(len(names) for names in kinds)
        self.grid = self.kinds * self.width
        self.tail = tuple(tail)
        self.pos: dict[str, int] = {}
        self._counts: set[str] = set()
        for k, names in enumerate(kinds):
            for i, name in enumerate(names):
                if name is not None:
                    self.pos[name] = k * self.width + i
                    if name == count_name(k):
                        self._counts.add(name)
        if not tok.compact:  # compact: tail rows are summed where they are loaded
            for j, name in enumerate(self.tail):
                self.pos[name] = self.grid + j
        self.size = self.grid + (0 if tok.compact else len(self.tail))
        self._mm_slots = [] if mm is None else list(range(*mm.indices(self.width)))
        self._sums: np.ndarray | None = None
        self._totals: np.ndarray | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._tail_parts: dict[str, int] = {}
        self.q: torch.Tensor | None = None
        self.state = "planned"

    def is_count(self, name: str) -> bool:
        return name in self._counts

    def bind(self, storage: torch.Tensor, rows: dict[int, int]) -> None:
        self._storage: torch.Tensor | None = storage
        self._map = rows

    def unbind(self) -> None:
        """Let go of the storage (the round is reduced: what it read back is in its parts)."""
        if self.state == "open":
            raise RuntimeError("unbind() a round that is still open")
        self._storage = self.q = None
        self._views.clear()

    def start(self) -> Rows:
        """Open the round: the rows are the storage's now (what an earlier round left there is readable)."""
        f = self.f
        if self.state != "planned" or f._open is not None:
            raise RuntimeError("start() a planned round, after the previous one is reduced")
        f._open, self.state = self, "open"
        self.q = self._storage
        counts = [count_name(k) for k in range(self.kinds) if count_name(k) in self.pos]
        for name in counts:
            f.count_rows.setdefault(self.pos[name] // self.width, (self, name))
        if counts and not self.tok.compact:  # compact: the counts are known, the rows not stored
            self.rows(*counts).fill_(1.0)
        return self

    # -- writing the rows -----------------------------------------------------------------------------------------

    def _row(self, name: str) -> int:
        if self.q is None:
            raise RuntimeError("start() the round first")
        return self._map[self.pos[name]]

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._views.get(name)
        if view is None:
            assert self.q is not None
            view = self._views[name] = self.q[self._row(name)]
        return view

    def rows(self, *names: str) -> torch.Tensor:
        """Several rows as one view (ascending, evenly spaced in the storage: any two are): an elementwise op
        then covers them all at once."""
        rows = [self._row(n) for n in names]
        assert self.q is not None
        if len(rows) == 1:
            return self.q[rows[0]:rows[0] + 1]
        step = rows[1] - rows[0]
        if step <= 0 or any(b - a != step for a, b in pairwise(rows)):
            raise ValueError(f"rows {names} are not evenly spaced in ascending order")
        return self.q[rows[0]:rows[-1] + 1:step]

    def load(self, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        """Copy ``[B, T]`` inputs into rows: one ``stack`` for consecutive rows (masked), a gather each (compact,
        where ``tail`` rows are summed over ``T`` instead)."""
        tok = self.tok
        if tok.compact:
            done: dict[int, torch.Tensor] = {}  # an input loaded into several rows is gathered once
            for name, given in zip(names, tensors, strict=True):
                t = given.detach()
                if name in self.tail:
                    self._tail_parts[name] = self.f.part(t.sum(-1, dtype=self.f.dtype))
                elif id(given) in done:  # `given` is alive in `tensors`: its id is not reused meanwhile
                    self[name].copy_(done[id(given)])
                elif t.dtype == self.f.dtype:
                    done[id(given)] = torch.index_select(t.reshape(-1), 0, tok.index, out=self[name])
                else:
                    done[id(given)] = self[name].copy_(t.reshape(-1).index_select(0, tok.index))
            return
        rows = [self._row(n) for n in names]
        assert self.q is not None
        if rows == list(range(rows[0], rows[0] + len(rows))):
            torch.stack([t.detach() for t in tensors], out=self.q[rows[0]:rows[-1] + 1])
        else:
            for r, t in zip(rows, tensors, strict=True):
                self.q[r].copy_(t.detach())

    # -- reducing them --------------------------------------------------------------------------------------------

    def reduce(self, *, per_seq: Sequence[str] = (), sq: Sequence[str] = (), var: Sequence[str] = ()) -> Rows:
        """Mask and reduce every row to its sum, and the ``mm`` rows to their maxima and minima. ``per_seq``: the
        rows whose per-sequence sums are wanted (sequence means, per-sequence values; the masked layout has them
        for every row). ``sq``: the sums of these rows' squares (per sequence where ``per_seq``). ``var``:
        consecutive RESP rows right after the count row, whose sums of squared deviations from their mean are
        wanted (two passes, as the frameworks compute variances)."""
        f = self.f
        if self.state != "open":
            raise RuntimeError("reduce() an open round")
        self.state, f._open = "reduced", None
        self._var = list(var)
        self._per_seq = set(per_seq)
        self._sq: dict[str, int] = {}
        if var:
            self._check_var(var)
        if self.tok.compact:
            self._reduce_compact(per_seq, sq, var)
        else:
            self._reduce_masked(sq, var)
        return self

    def _check_var(self, var: Sequence[str]) -> None:
        first = self.pos[var[0]]
        if ([self.pos[n] for n in var] != list(range(first, first + len(var))) or first >= self.width
                or self.pos.get(count_name(RESP)) != first - 1):
            raise ValueError(f"var rows {var} must be consecutive RESP rows right after the count row")

    def _reduce_masked(self, sq: Sequence[str], var: Sequence[str]) -> None:
        f, tok = self.f, self.tok
        q = self.q[:self.size]  # type: ignore[index]
        b, slots = tok.shape[0], len(self._mm_slots)
        if tok.size == 0:  # nothing to mask or reduce (amax of an empty tensor raises)
            full = (lambda value, *shape: f.part(torch.full(shape, value, dtype=q.dtype, device=q.device)))
            if slots:
                self._mx, self._mn = full(-_INF, self.kinds, slots), full(_INF, self.kinds, slots)
            self._rs = full(0.0, self.size, b)
            self._sq = {name: full(0.0, b) for name in sq}
            if var:
                self._m2 = full(0.0, len(var))
            return
        grid = q[:self.grid].view(self.kinds, self.width, *tok.shape)
        drop = tok.drop[:self.kinds].unsqueeze(1)  # [kinds, 1, B, T]: broadcast over each kind's rows
        if slots:
            block = grid[:, self.mm]
            block.masked_fill_(drop, -_INF)
            self._mx = f.part(block.amax((-2, -1)))
            block.masked_fill_(drop, _INF)
            self._mn = f.part(block.amin((-2, -1)))
        grid.masked_fill_(drop, 0.0)
        sums = q.sum(-1)  # [rows, B]
        self._rs = f.part(sums)
        for name in sq:  # per sequence sqrt(sum x^2): one reduction, squared on the host
            self._sq[name] = f.part(torch.linalg.vector_norm(self[name], dim=-1))
        if var:  # the count row's and the rows' sums -> their means, subtracted in place, padding refilled with 0
            first = self.pos[var[0]]
            totals = sums[first - 1:first + len(var)].sum(-1)
            block = q[first:first + len(var)]
            block.addcdiv_(totals[1:, None, None], totals[0], value=-1.0)
            block.masked_fill_(tok.drop[RESP], 0.0)
            self._m2 = f.part(torch.linalg.vector_norm(block, dim=(-2, -1)))

    def _reduce_compact(self, per_seq: Sequence[str], sq: Sequence[str], var: Sequence[str]) -> None:
        """On numpy views of the rows (the compact layout's are CPU tensors): numpy's reductions cost a third of
        torch's per call on small rows, and the results need no copy."""
        f, tok = self.f, self.tok
        assert self.q is not None
        v = self.q.numpy()
        stored = {n: self._row(n) for n, p in self.pos.items() if p < self.grid and n not in self._counts}
        in_fin = {n for n in stored if self.pos[n] // self.width == FIN}
        in_mm = {n for n in stored if self.pos[n] % self.width in self._mm_slots}
        off = tok.off_fin() if in_fin else None
        with np.errstate(all="ignore"):  # inf/NaN tokens give inf/NaN results, as torch's, without a warning
            if in_mm:
                mm, mm_fin = _runs(sorted(stored[n] for n in in_mm)), _runs(sorted(stored[n] for n in in_mm & in_fin))
                mx, mn = np.full(v.shape[0], -_INF, dtype=v.dtype), np.full(v.shape[0], _INF, dtype=v.dtype)
                for a, b in mm_fin:  # FIN rows: outside the final mask -inf for the maximum, +inf for the minimum
                    v[a:b, off] = -_INF
                for a, b in mm if tok.size else ():
                    np.maximum.reduce(v[a:b], axis=1, out=mx[a:b])
                for a, b in mm_fin:
                    v[a:b, off] = _INF
                for a, b in mm if tok.size else ():
                    np.minimum.reduce(v[a:b], axis=1, out=mn[a:b])
                self._mx, self._mn = f.part(mx), f.part(mn)
            for a, b in _runs(sorted(stored[n] for n in in_fin)):  # FIN rows: zero outside the final mask
                v[a:b, off] = 0.0
            totals = np.zeros(v.shape[0], dtype=v.dtype)
            for a, b in _runs(sorted(stored.values())):
                np.add.reduce(v[a:b], axis=1, out=totals[a:b])
            self._rs = f.part(totals)
            if per_seq:
                self._seq = f.part(tok.segment_sums(v, _runs(sorted(stored[n] for n in per_seq))))
            for name in sq:
                row = v[stored[name]]
                self._sq[name] = f.part(tok.segment_sums(np.square(row)[None])[0] if name in self._per_seq
                                        else np.dot(row, row)[None])
            if var:
                first = stored[var[0]]
                block = v[first:first + len(var)]
                if tok.size:
                    block -= totals[first:first + len(var), None] / tok.size
                self._m2 = f.part(np.linalg.norm(block, axis=1))

    # -- reading them on the host (after Fused.read) ---------------------------------------------------------------

    def _kind(self, name: str) -> int:
        return self.pos[name] // self.width

    def per_seq(self, name: str) -> np.ndarray:
        """Per-sequence sums ``[B]`` (float64; on the compact layout, of the rows reduced with ``per_seq``)."""
        if name in self._tail_parts:
            return self.f.host[self._tail_parts[name]].astype(np.float64)
        if self.tok.compact:
            if name in self._counts:
                return self.f.counts(self._kind(name))
            if name not in self._per_seq:
                raise KeyError(f"row {name!r} was not reduced per sequence: reduce(per_seq=[{name!r}, ...])")
        return self._host_sums()[self._host_row(name)]

    def _host_row(self, name: str) -> int:
        return self._map[self.pos[name]] if self.tok.compact else self.pos[name]

    def _host_sums(self) -> np.ndarray:
        if self._sums is None:
            b = self.tok.shape[0]
            part = self._seq if self.tok.compact else self._rs
            self._sums = self.f.host[part].astype(np.float64).reshape(-1, b) if b else np.zeros((self.size, 0))
        return self._sums

    def total(self, name: str) -> float:
        if name in self._tail_parts or name in self._counts:
            return float(self.per_seq(name).sum())
        if self._totals is None:
            self._totals = (self.f.host[self._rs].astype(np.float64) if self.tok.compact
                            else self._host_sums().sum(1))
        return float(self._totals[self._host_row(name)])

    def seq_sum(self, name: str) -> float:
        """Sum over the sequences that have tokens of the row's kind of each one's mean (the others add 0)."""
        return float(self.per_seq(name) @ self.f.inverse_counts(self._kind(name)))

    def sq_per_seq(self, name: str) -> np.ndarray:
        """Per-sequence sums of the row's squares (float64)."""
        x = self.f.host[self._sq[name]].astype(np.float64)
        return x if self.tok.compact else np.square(x)

    def sq_total(self, name: str) -> float:
        return float(self.sq_per_seq(name).sum())

    def sq_seq_sum(self, name: str) -> float:
        """:meth:`seq_sum` of the row's squares."""
        return float(self.sq_per_seq(name) @ self.f.inverse_counts(self._kind(name)))

    def _mm(self, name: str, part: int) -> float:
        p = self.pos[name]
        if self.tok.compact:
            return float(self.f.host[part][self._map[p]])
        return float(self.f.host[part][(p // self.width) * len(self._mm_slots) + self._mm_slots.index(p % self.width)])

    def max(self, name: str) -> float:
        """Over the row's tokens; NaN when there are none."""
        return self._mm(name, self._mx) if self.f.n(self._kind(name)) else math.nan

    def min(self, name: str) -> float:
        return self._mm(name, self._mn) if self.f.n(self._kind(name)) else math.nan

    def m2(self, name: str) -> float:
        """Sum of squared deviations from the mean of a ``var`` row."""
        return float(self.f.host[self._m2][self._var.index(name)]) ** 2


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Ascending row indices as ``[start, stop)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs
