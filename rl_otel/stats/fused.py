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

The modules: :mod:`rl_otel.stats.tokens` (the batch's tokens and masks), this one (the call's storage and parts,
and a round's rows as the caller writes them), :mod:`rl_otel.stats.reduce` (a round masked and reduced on either
layout) and :mod:`rl_otel.stats.reduced` (what a round reduced, read on the host after the transfer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np
import torch

from rl_otel.stats.reduce import reduce_compact, reduce_masked
from rl_otel.stats.reduced import Reduced
from rl_otel.stats.tokens import COUNT_KINDS, FIN, RESP, Tokens

Slot = str | tuple[str, ...] | None  # a row's name, several names that use the slot in turn, or an unused slot


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
                assert rows.result is not None, "the count's round is reduced before the transfer"
                counts = rows.result.per_seq(name)
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
class Layout:
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
            scratch: tuple[str, ...]) -> Layout:
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
                kind = COUNT_KINDS.get(name)
                if kind is not None:
                    if kind != k:
                        raise ValueError(f"count row {name!r} in the rows of kind {k}")
                    counts[name] = k
                elif name not in scratch:
                    reduced[name] = len(slot_kind)
            slot_kind.append(k)
    if len(set(reduced.values())) < len(reduced):
        raise ValueError(f"rows {sorted(reduced)} reduce two in a slot: mark all but one scratch")
    return Layout(widths=widths, grid=grid, starts=tuple(sum(widths[:k]) for k in range(len(kinds))),
                  size=sum(widths), scratch=frozenset(scratch), pos=pos, slot_kind=tuple(slot_kind), counts=counts,
                  reduced=reduced, mm_slots=() if mm is None else tuple(range(*slice(*mm).indices(widths[0]))))


class Rows:
    """One round: named rows of the call's storage, written by the caller, then masked and reduced together
    (:meth:`reduce`, which returns the results to read on the host: a :class:`~rl_otel.stats.reduced.Reduced`).

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
        self.f, self.tok, self.kinds, self.mm, self.layout = f, tok, len(kinds), mm, layout
        self.widths, self.grid, self.starts, self.size = layout.widths, layout.grid, layout.starts, layout.size
        self.scratch, self.pos = layout.scratch, layout.pos
        self._views: dict[str, torch.Tensor] = {}
        self._storage: torch.Tensor | None = None
        self.slot_rows: dict[int, int] | None = None  # compact: slot -> storage row (masked: the slots are the rows)
        self.offset, self.sums_part = 0, -1
        self.q: torch.Tensor | None = None
        self.state = "planned"
        self.result: Reduced | None = None  # what reduce() gave

    def is_count(self, name: str) -> bool:
        return name in self.layout.counts

    def count_names(self) -> list[tuple[int, str]]:
        return [(kind, name) for name, kind in self.layout.counts.items()]

    def stored_slots(self) -> set[int]:
        """Slots that need storage on the compact layout (counts are known there, not stored)."""
        return {slot for name, slot in self.pos.items() if name not in self.layout.counts}

    def bind(self, storage: torch.Tensor, rows: dict[int, int] | None, *, offset: int = 0, sums_part: int = -1
             ) -> None:
        """The storage (and, compact, slot -> storage row; masked: the slots are the rows and the round's sums are
        ``offset`` rows into the section's sums buffer, part ``sums_part``)."""
        self._storage, self.slot_rows, self.offset, self.sums_part = storage, rows, offset, sums_part

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
        return slot if self.slot_rows is None else self.slot_rows[slot]

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

    def reduce(self, *, per_seq: Sequence[str] = (), sq: Sequence[str] = (), var: Sequence[str] = ()) -> Reduced:
        """Mask and reduce every row to its sum, and the ``mm`` rows to their maxima and minima. ``per_seq``: the
        rows whose per-sequence sums are wanted (sequence means, per-sequence values; the masked layout has them
        for every row). ``sq``: the sums of these rows' squares (per sequence where ``per_seq``). ``var``:
        consecutive RESP rows whose sums of squared deviations from their mean are wanted (two passes, as the
        frameworks compute variances; the mean divides by the RESP count of this section, reduced before).
        Returns the results, to read after :meth:`Fused.read` (:mod:`rl_otel.stats.reduce` does the work)."""
        f = self.f
        if self.state != "open":
            raise RuntimeError("reduce() an open round")
        self.state, f._open = "reduced", None
        if var:
            self._check_var(var)
        out = self.result = Reduced(f, self.layout, self.slot_rows, self.offset, self.sums_part, per_seq, var)
        if self.tok.compact:
            reduce_compact(self, out, per_seq, sq, var)
        else:
            reduce_masked(self, out, sq, var)
        return out

    def _check_var(self, var: Sequence[str]) -> None:
        first = self.pos[var[0]]
        if ([self.pos[n] for n in var] != list(range(first, first + len(var)))
                or any(self.layout.slot_kind[self.pos[n]] != RESP for n in var)):
            raise ValueError(f"var rows {var} must be consecutive RESP rows")
