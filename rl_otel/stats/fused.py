"""A batch's per-token statistics in a few stacked reductions, read back with one host transfer.

``ppo_stats`` writes the per-token quantities it needs (log-ratios, clipped-token flags, losses, the inputs
themselves) as the rows of one buffer, each row tagged with the mask it is reduced over: the response tokens
(``RESP``) or ROLL's final mask within them (``FIN``). A :class:`Rows` round masks and reduces all its rows
together: one masked fill and one ``sum`` give every row's per-sequence sums, two fills and an ``amax``/``amin``
the maxima and minima, so a call launches a few dozen kernels whatever the number of keys (each framework's metric
code launches several per metric and reads each back with its own ``.item()``). Everything reduced is a *part* of
:class:`Fused`, moved to the host at once and read there in float64: the keys' formulas (means, sequence means,
variances, the frameworks' rules for an empty selection) run on ``[rows, B]`` per-sequence sums and a few numbers.

A section plans its rounds first (:meth:`Fused.plan`); they share one buffer, a round reusing the *slots* (rows)
of the rounds before it, so the peak memory is the widest round's rows plus the masks. Narrow rounds hold less
and cost kernels (a fill and a sum each): the sections size theirs to stay within issue 32's 40 kernels a call. A
round may read what an earlier round left in a slot it has not written yet (:meth:`Fused.rows` builds one view of
rows of several rounds). The rows have two layouts:

- masked (``compact=False``, the accelerator path): a row is the whole ``[B, T]`` batch, padding included. A
  round's kinds of equal width form a ``[kinds, width]`` grid, so the ``[kinds, 1, B, T]`` keep mask broadcast
  over it masks both kinds in one ``torch.where``; kinds of unequal width are masked one block each. ``sum(-1)``
  writes ``[rows, B]`` into the section's one sums buffer, so a variance can divide by a count another round
  summed (the count row right before the variance rows: one ``sum`` gives both). Padding is filled before anything
  is summed: it never counts, even NaN. Count rows (:func:`count_name`) are filled with ones when the round is
  reduced, so until then their slot is free scratch.
- compact (``compact=True``, the CPU path, CPU tensors only): the response tokens are gathered once (an index of
  the mask: a device sync on an accelerator, free on a CPU) and a row holds the ``L`` selected tokens, so there is
  no padding. A round is reduced on numpy views of its rows (a third of torch's per-call cost on small rows): FIN
  rows are written at the few tokens outside the final mask through an index of them (a boolean fill reads every
  token, 14x the time on a CPU), per-sequence sums are segmented sums of the rows, which are in sequence order.
  Only the slots some round stores something in get storage (count rows are known counts here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np
import torch

RESP, FIN = 0, 1

_INF = math.inf

Slot = str | tuple[str, ...] | None  # a row's name, several names that use the slot in turn, or an unused slot


def count_name(kind: int) -> str:
    """The name of the row of ones of ``kind``: its sums are the kind's token counts (a section declares it in one
    of its rounds; a variance reads the count of its own section)."""
    return "1" if kind == RESP else "1f"


_COUNTS = {count_name(RESP): RESP, count_name(FIN): FIN}


@lru_cache(maxsize=64)
def _fill(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim tensor on ``device``: ``torch.where``'s ``out=`` form takes no Python number. Made once
    per device, dtype and value (three values: -inf, inf, 0) by a fill kernel: ``torch.full`` writes it on the
    device, where ``torch.tensor(value, device=...)`` would copy it from the host (a host sync on a GPU)."""
    return torch.full((), value, dtype=dtype, device=device)


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


class Fused:
    """One ``ppo_stats`` call: its tokens, the rounds' shared storage, and the parts read back in one transfer."""

    def __init__(self, tokens: Tokens, dtype: torch.dtype) -> None:
        self.tokens = tokens
        self.dtype = dtype
        self.parts: list[torch.Tensor | np.ndarray] = []
        self.host: list[np.ndarray] = []
        self.count_rows: dict[int, tuple[Rows, str]] = {}  # kind -> the first round (of the call) counting it
        self.section_counts: dict[int, tuple[Rows, str]] = {}  # kind -> the round of this section counting it
        self.sums: torch.Tensor | None = None  # masked: the section's per-sequence sums, [rows of its rounds, B]
        self._storage: torch.Tensor | None = None
        self._open: Rows | None = None
        self._planned: list[Rows] = []
        self._host_counts: dict[int, tuple[np.ndarray, np.ndarray, float, int]] = {}
        self._host64: dict[int, np.ndarray] = {}
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
        """Storage for a section's rounds, which reuse it in turn (each may read rows an earlier one left in slots
        it has not written yet). Masked: the widest round's slots, and one ``[rows, B]`` sums buffer with a slice
        for each round in the order given here; compact: the slots some round stores a row in."""
        if self._open is not None:
            raise RuntimeError("a round is still open: reduce() it before planning the next")
        for done in self._planned:  # an earlier section's rounds, reduced: their storage is free to go
            done.unbind()
        self._planned = list(rounds)
        tok = self.tokens
        if tok.compact:
            slots = sorted({slot for r in rounds for slot in r.stored_slots()})
            rows, slot_rows = len(slots), {slot: i for i, slot in enumerate(slots)}
        else:
            rows, slot_rows = max(r.size for r in rounds), None
        if self._storage is None or self._storage.shape[0] < rows:
            self._storage = None  # the old buffer goes before the new one is made
            self._storage = torch.empty((rows, *tok.row_shape), dtype=self.dtype, device=tok.device)
        self.section_counts = {}
        if not tok.compact:
            self.sums = torch.empty((sum(r.size for r in rounds), tok.shape[0]), dtype=self.dtype, device=tok.device)
            sums_part, offset = self.part(self.sums), 0
        for r in rounds:
            if tok.compact:
                r.bind(self._storage, slot_rows)
            else:
                r.bind(self._storage, None, offset=offset, sums_part=sums_part)
                offset += r.size
            for kind, name in r.count_names():
                self.section_counts.setdefault(kind, (r, name))
                self.count_rows.setdefault(kind, (r, name))

    def rows(self, *pairs: tuple[Rows, str]) -> torch.Tensor:
        """Rows of several rounds of the section as one view (ascending, evenly spaced in the storage): an
        elementwise op then covers them at once, e.g. a row an earlier round left and one of the open round."""
        assert self._storage is not None
        return _view(self._storage, [r.row_index(name) for r, name in pairs], [name for _, name in pairs])

    def close(self) -> None:
        """Drop the storage and the rounds (which refer back to this object): the memory is free when the call
        returns, not when Python's cyclic garbage collector next runs (on a GPU, a round buffer of device memory)."""
        self.count_rows.clear()
        self.section_counts.clear()
        for done in self._planned:
            done.unbind()
        self._planned = []
        self._storage = self.sums = None
        self.parts.clear()
        self.host = []
        self._host64.clear()

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

    def host64(self, part: int) -> np.ndarray:
        """A part read back, in float64 (converted once: the rounds of a section share their sums' part)."""
        hit = self._host64.get(part)
        if hit is None:
            hit = self._host64[part] = self.host[part].astype(np.float64)
        return hit

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


def _view(storage: torch.Tensor, rows: list[int], names: Sequence[str]) -> torch.Tensor:
    if len(rows) == 1:
        return storage[rows[0]:rows[0] + 1]
    step = rows[1] - rows[0]
    if step <= 0 or any(b - a != step for a, b in pairwise(rows)):
        raise ValueError(f"rows {tuple(names)} are not evenly spaced in ascending order")
    return storage[rows[0]:rows[-1] + 1:step]


@dataclass(frozen=True)
class _Layout:
    """A round's slots, parsed once per layout (the sections build the same few layouts every call)."""

    widths: tuple[int, ...]
    grid: bool  # kinds of one width: one [kinds, width] view, one keep mask broadcast over it
    starts: tuple[int, ...]  # each kind's first slot
    size: int
    scratch: frozenset[str]
    pos: dict[str, int]  # name -> slot (read only)
    slot_kind: tuple[int, ...]
    counts: dict[str, int]  # count row -> its kind
    reduced: dict[str, int]  # the rows reduced (not scratch, not counts) -> their slots
    mm_slots: tuple[int, ...]  # within each kind


@lru_cache(maxsize=256)
def _layout(kinds: tuple[tuple[Slot, ...], ...], mm: tuple[int | None, int | None, int | None] | None,
            scratch: tuple[str, ...]) -> _Layout:
    widths = tuple(len(names) for names in kinds)
    grid = len(set(widths)) == 1
    if mm is not None and not grid:
        raise ValueError("maxima and minima are taken over kinds of one width")
    pos: dict[str, int] = {}
    slot_kind: list[int] = []
    counts: dict[str, int] = {}
    reduced: dict[str, int] = {}
    for k, names in enumerate(kinds):
        for entry in names:
            for name in (entry,) if isinstance(entry, str) else (entry or ()):
                if name in pos:
                    raise ValueError(f"row {name!r} named twice")
                pos[name] = len(slot_kind)
                kind = _COUNTS.get(name)
                if kind is not None:
                    if kind != k:
                        raise ValueError(f"count row {name!r} in the rows of kind {k}")
                    counts[name] = k
                elif name not in scratch:
                    reduced[name] = len(slot_kind)
            slot_kind.append(k)
    if len(set(reduced.values())) < len(reduced):
        raise ValueError(f"rows {sorted(reduced)} reduce two in a slot: mark all but one scratch")
    return _Layout(widths=widths, grid=grid, starts=tuple(sum(widths[:k]) for k in range(len(kinds))),
                   size=sum(widths), scratch=frozenset(scratch), pos=pos, slot_kind=tuple(slot_kind), counts=counts,
                   reduced=reduced, mm_slots=() if mm is None else tuple(range(*slice(*mm).indices(widths[0]))))


class Rows:
    """One round: named rows of the call's storage, written by the caller, then masked and reduced together.

    ``kinds[k]`` lists the slots of the rows of kind ``k``, in storage order, kind after kind: a name, a tuple of
    names that use the slot in turn (all but one scratch, or a count row last), or ``None`` (a slot the round
    leaves alone: what an earlier round left there is readable). Kinds of one width are masked as one grid.
    ``mm`` selects, within each kind, the slots whose maxima and minima are wanted (kinds of one width). ``scratch``
    names rows that are not reduced (the compact layout skips them; the masked layout reduces the whole round,
    them too, unread). Count rows (:func:`count_name`) are filled with ones when the round is reduced.
    """

    def __init__(self, f: Fused, kinds: Sequence[Sequence[Slot]], *, mm: slice | None = None,
                 scratch: Sequence[str] = ()) -> None:
        tok = f.tokens
        if not 0 < len(kinds) <= tok.kinds:
            raise ValueError(f"{len(kinds)} kinds of rows, the batch has {tok.kinds} masks")
        layout = _layout(tuple(tuple(names) for names in kinds), None if mm is None else (mm.start, mm.stop, mm.step),
                         tuple(scratch))
        self.f, self.tok, self.kinds, self.mm = f, tok, len(kinds), mm
        self.widths, self.grid, self.starts, self.size = layout.widths, layout.grid, layout.starts, layout.size
        self.scratch, self.pos = layout.scratch, layout.pos
        self._slot_kind, self._counts, self._reduced = layout.slot_kind, layout.counts, layout.reduced
        self._mm_slots = layout.mm_slots
        self._sums: np.ndarray | None = None
        self._totals: np.ndarray | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._storage: torch.Tensor | None = None
        self._map: dict[int, int] | None = None
        self.offset, self._sums_part = 0, -1
        self.q: torch.Tensor | None = None
        self.state = "planned"

    def is_count(self, name: str) -> bool:
        return name in self._counts

    def count_names(self) -> list[tuple[int, str]]:
        return [(kind, name) for name, kind in self._counts.items()]

    def stored_slots(self) -> set[int]:
        """Slots that need storage on the compact layout (counts are known there, not stored)."""
        return {slot for name, slot in self.pos.items() if name not in self._counts}

    def _kind_slot(self, slot: int) -> tuple[int, int]:
        kind = self._slot_kind[slot]
        return kind, slot - self.starts[kind]

    def bind(self, storage: torch.Tensor, rows: dict[int, int] | None, *, offset: int = 0, sums_part: int = -1
             ) -> None:
        """The storage (and, compact, slot -> storage row; masked: the slots are the rows and the round's sums are
        ``offset`` rows into the section's sums buffer, part ``sums_part``)."""
        self._storage, self._map, self.offset, self._sums_part = storage, rows, offset, sums_part

    def unbind(self) -> None:
        """Let go of the storage (the round is reduced: what it read back is in its parts)."""
        if self.state == "open":
            raise RuntimeError("unbind() a round that is still open")
        self._storage = self.q = None
        self._views.clear()

    def start(self) -> Rows:
        """Open the round: the rows are the storage's now (what an earlier round left there is readable)."""
        f = self.f
        if self.state != "planned" or f._open is not None or self._storage is None:
            raise RuntimeError("start() a planned round, after the previous one is reduced")
        f._open, self.state = self, "open"
        self.q = self._storage
        return self

    # -- writing the rows -----------------------------------------------------------------------------------------

    def row_index(self, name: str) -> int:
        """The storage row of ``name`` (also once the round let go of the storage: where its results are)."""
        if self.state == "planned" and self._storage is None:
            raise RuntimeError("plan() the round first")
        slot = self.pos[name]
        return slot if self._map is None else self._map[slot]

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._views.get(name)
        if view is None:
            if self.q is None:
                raise RuntimeError("start() the round first")
            view = self._views[name] = self.q[self.row_index(name)]
        return view

    def rows(self, *names: str) -> torch.Tensor:
        """Several rows as one view (ascending, evenly spaced in the storage: any two are): an elementwise op
        then covers them all at once."""
        if self.q is None:
            raise RuntimeError("start() the round first")
        return _view(self.q, [self.row_index(n) for n in names], names)

    def load(self, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        """Copy ``[B, T]`` inputs into rows: one ``stack`` for consecutive rows (masked), a gather each
        (compact)."""
        if self.q is None:
            raise RuntimeError("start() the round first")
        tok = self.tok
        if tok.compact:
            done: dict[int, torch.Tensor] = {}  # an input loaded into several rows is gathered once
            for name, given in zip(names, tensors, strict=True):
                t = given.detach()
                if id(given) in done:  # `given` is alive in `tensors`: its id is not reused meanwhile
                    self[name].copy_(done[id(given)])
                elif t.dtype == self.f.dtype:
                    done[id(given)] = torch.index_select(t.reshape(-1), 0, tok.index, out=self[name])
                else:
                    done[id(given)] = self[name].copy_(t.reshape(-1).index_select(0, tok.index))
            return
        rows = [self.row_index(n) for n in names]
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
        consecutive RESP rows whose sums of squared deviations from their mean are wanted (two passes, as the
        frameworks compute variances; the mean divides by the RESP count of this section, reduced before)."""
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
        if ([self.pos[n] for n in var] != list(range(first, first + len(var)))
                or any(self._slot_kind[self.pos[n]] != RESP for n in var)):
            raise ValueError(f"var rows {var} must be consecutive RESP rows")

    def _blocks(self, q: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The round's rows and the keep masks to broadcast over them: one grid, or one block a kind."""
        tok, (b, t) = self.tok, self.tok.shape
        if self.grid:
            return [(q[:self.size].view(self.kinds, self.widths[0], b, t), tok.keep[:self.kinds].unsqueeze(1))]
        return [(q[s:s + w], tok.keep[k]) for k, (s, w) in enumerate(zip(self.starts, self.widths, strict=True)) if w]

    def _reduce_masked(self, sq: Sequence[str], var: Sequence[str]) -> None:
        f, tok = self.f, self.tok
        q = self.q
        assert q is not None and f.sums is not None
        counts = sorted(self._counts, key=self.pos.__getitem__)
        if counts:
            self.rows(*counts).fill_(1.0)
        sums = f.sums[self.offset:self.offset + self.size]
        b, slots = tok.shape[0], len(self._mm_slots)
        dtype, device = q.dtype, q.device
        if tok.size == 0:  # nothing to mask or reduce (amax of an empty tensor raises)
            full = (lambda value, *shape: f.part(torch.full(shape, value, dtype=dtype, device=device)))
            if slots:
                self._mx, self._mn = full(-_INF, self.kinds, slots), full(_INF, self.kinds, slots)
            sums.zero_()
            self._sq = {name: full(0.0, b) for name in sq}
            if var:
                self._m2 = full(0.0, len(var))
            return
        blocks = self._blocks(q)
        if slots:
            grid, keep = blocks[0]
            block = grid[:, self.mm]
            torch.where(keep, block, _fill(-_INF, dtype, device), out=block)
            self._mx = f.part(block.amax((-2, -1)))
            torch.where(keep, block, _fill(_INF, dtype, device), out=block)
            self._mn = f.part(block.amin((-2, -1)))
        zero = _fill(0.0, dtype, device)
        for rows, keep in blocks:
            torch.where(keep, rows, zero, out=rows)
        torch.sum(q[:self.size], -1, out=sums)  # [rows, B]
        for name in sq:  # per sequence sqrt(sum x^2): one reduction, squared on the host
            self._sq[name] = f.part(torch.linalg.vector_norm(self[name], dim=-1))
        if var:
            self._m2 = f.part(self._deviations(q, var))

    def _deviations(self, q: torch.Tensor, var: Sequence[str]) -> torch.Tensor:
        """Masked: the ``var`` rows' means subtracted in place (padding refilled with 0), and the norms of what is
        left. The mean divides by the section's RESP count; one ``sum`` gives the count and the rows' totals
        where the count row's sums sit right before theirs in the sums buffer (two otherwise)."""
        f = self.f
        assert f.sums is not None
        counter, name = f.section_counts[RESP]
        if counter.state != "reduced":  # (this round's own count is summed with its rows, before this)
            raise RuntimeError("a variance divides by a count reduced before it: reduce the count's round first")
        count = counter.offset + counter.pos[name]
        first = self.pos[var[0]]
        at = self.offset + first
        if count == at - 1:
            totals = f.sums[count:at + len(var)].sum(-1)
            n, totals = totals[0], totals[1:]
        else:
            n, totals = f.sums[count].sum(), f.sums[at:at + len(var)].sum(-1)
        block = q[first:first + len(var)]
        block.addcdiv_(totals[:, None, None], n, value=-1.0)
        torch.where(self.tok.keep[RESP], block, _fill(0.0, block.dtype, block.device), out=block)
        return torch.linalg.vector_norm(block, dim=(-2, -1))

    def _reduce_compact(self, per_seq: Sequence[str], sq: Sequence[str], var: Sequence[str]) -> None:
        """On numpy views of the rows (the compact layout's are CPU tensors): numpy's reductions cost a third of
        torch's per call on small rows, and the results need no copy."""
        f, tok = self.f, self.tok
        assert self.q is not None
        v = self.q.numpy()
        assert self._map is not None
        stored = {name: self._map[slot] for name, slot in self._reduced.items()}
        kind, mm_slots, starts = self._slot_kind, self._mm_slots, self.starts
        fin = [stored[n] for n, slot in self._reduced.items() if kind[slot] == FIN] if self.kinds > FIN else []
        with np.errstate(all="ignore"):  # inf/NaN tokens give inf/NaN results, as torch's, without a warning
            if mm_slots:
                mm = [stored[n] for n, slot in self._reduced.items() if slot - starts[kind[slot]] in mm_slots]
                mm_fin = _runs(sorted(set(mm) & set(fin)))
                off = tok.off_fin() if mm_fin else None
                mx, mn = np.full(v.shape[0], -_INF, dtype=v.dtype), np.full(v.shape[0], _INF, dtype=v.dtype)
                for a, b in mm_fin:  # FIN rows: outside the final mask -inf for the maximum, +inf for the minimum
                    v[a:b, off] = -_INF
                for a, b in _runs(sorted(mm)) if tok.size else ():
                    np.maximum.reduce(v[a:b], axis=1, out=mx[a:b])
                for a, b in mm_fin:
                    v[a:b, off] = _INF
                for a, b in _runs(sorted(mm)) if tok.size else ():
                    np.minimum.reduce(v[a:b], axis=1, out=mn[a:b])
                self._mx, self._mn = f.part(mx), f.part(mn)
            for a, b in _runs(sorted(fin)):  # FIN rows: zero outside the final mask
                v[a:b, tok.off_fin()] = 0.0
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
                self._m2 = f.part(np.sqrt(np.einsum("ij,ij->i", block, block)))

    # -- reading them on the host (after Fused.read) ---------------------------------------------------------------

    def _kind(self, name: str) -> int:
        return self._slot_kind[self.pos[name]]

    def per_seq(self, name: str) -> np.ndarray:
        """Per-sequence sums ``[B]`` (float64; on the compact layout, of the rows reduced with ``per_seq``)."""
        if self.tok.compact:
            if name in self._counts:
                return self.f.counts(self._kind(name))
            if name not in self._per_seq:
                raise KeyError(f"row {name!r} was not reduced per sequence: reduce(per_seq=[{name!r}, ...])")
        return self._host_sums()[self._host_row(name)]

    def _host_row(self, name: str) -> int:
        return self.row_index(name) if self.tok.compact else self.pos[name]

    def _host_sums(self) -> np.ndarray:
        if self._sums is None:
            b = self.tok.shape[0]
            if self.tok.compact:
                seq = self.f.host[self._seq]
                self._sums = seq.astype(np.float64).reshape(-1, b) if b else np.zeros((len(self.f.host[self._rs]), 0))
            else:
                sums = self.f.host64(self._sums_part).reshape(-1, b) if b else np.zeros((self.offset + self.size, 0))
                self._sums = sums[self.offset:self.offset + self.size]
        return self._sums

    def total(self, name: str) -> float:
        if name in self._counts:
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
        if self.tok.compact:
            return float(self.f.host[part][self.row_index(name)])
        kind, i = self._kind_slot(self.pos[name])
        return float(self.f.host[part][kind * len(self._mm_slots) + self._mm_slots.index(i)])

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
