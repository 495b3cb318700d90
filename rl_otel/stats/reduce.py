"""Masking and reducing one round's rows (:class:`rl_otel.stats.fused.Rows`) on either layout: the device work
of a round, registered as parts of the call (:meth:`Fused.part`) for the one transfer; what the parts hold is read
on the host by :class:`rl_otel.stats.reduced.Reduced`. The layouts are described in :mod:`rl_otel.stats.fused`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch

from rl_otel.stats.tokens import FIN, RESP

if TYPE_CHECKING:
    from rl_otel.stats.fused import Rows
    from rl_otel.stats.reduced import Reduced

_INF = math.inf


@lru_cache(maxsize=64)
def _fill(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim tensor on ``device``: ``torch.where``'s ``out=`` form takes no Python number. Made once
    per device, dtype and value (three values: -inf, inf, 0) by a fill kernel: ``torch.full`` writes it on the
    device, where ``torch.tensor(value, device=...)`` would copy it from the host (a host sync on a GPU)."""
    return torch.full((), value, dtype=dtype, device=device)


def _blocks(r: Rows, q: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The round's rows and the keep masks to broadcast over them: one grid, or one block a kind."""
    tok, (b, t) = r.tok, r.tok.shape
    if r.grid:
        return [(q[:r.size].view(r.kinds, r.widths[0], b, t), tok.keep[:r.kinds].unsqueeze(1))]
    return [(q[s:s + w], tok.keep[k]) for k, (s, w) in enumerate(zip(r.starts, r.widths, strict=True)) if w]


def reduce_masked(r: Rows, out: Reduced, sq: Sequence[str], var: Sequence[str]) -> None:
    """The masked layout: count rows filled with ones, padding filled (-inf, +inf for the extremes, 0 for the
    sums), then one ``sum`` of the whole round into its slice of the section's sums buffer."""
    f, tok = r.f, r.tok
    q = r.q
    assert q is not None and f.sums is not None
    counts = sorted(r.layout.counts, key=r.pos.__getitem__)
    if counts:
        r.rows(*counts).fill_(1.0)
    sums = f.sums[r.offset:r.offset + r.size]
    b, slots = tok.shape[0], len(r.layout.mm_slots)
    dtype, device = q.dtype, q.device
    if tok.size == 0:  # nothing to mask or reduce (amax of an empty tensor raises)
        full = (lambda value, *shape: f.part(torch.full(shape, value, dtype=dtype, device=device)))
        if slots:
            out.mx, out.mn = full(-_INF, r.kinds, slots), full(_INF, r.kinds, slots)
        sums.zero_()
        out.sq = {name: full(0.0, b) for name in sq}
        if var:
            out.m2_part = full(0.0, len(var))
        return
    blocks = _blocks(r, q)
    if slots:
        grid, keep = blocks[0]
        block = grid[:, r.mm]
        torch.where(keep, block, _fill(-_INF, dtype, device), out=block)
        out.mx = f.part(block.amax((-2, -1)))
        torch.where(keep, block, _fill(_INF, dtype, device), out=block)
        out.mn = f.part(block.amin((-2, -1)))
    zero = _fill(0.0, dtype, device)
    for rows, keep in blocks:
        torch.where(keep, rows, zero, out=rows)
    torch.sum(q[:r.size], -1, out=sums)  # [rows, B]
    for name in sq:  # per sequence sqrt(sum x^2): one reduction, squared on the host
        out.sq[name] = f.part(torch.linalg.vector_norm(r[name], dim=-1))
    if var:
        out.m2_part = f.part(_deviations(r, q, var))


def _deviations(r: Rows, q: torch.Tensor, var: Sequence[str]) -> torch.Tensor:
    """Masked: the ``var`` rows' means subtracted in place (padding refilled with 0), and the norms of what is
    left. The mean divides by the section's RESP count; one ``sum`` gives the count and the rows' totals
    where the count row's sums sit right before theirs in the sums buffer (two otherwise)."""
    f = r.f
    assert f.sums is not None
    counter, name = f.section_counts[RESP]
    if counter.state != "reduced":  # (this round's own count is summed with its rows, before this)
        raise RuntimeError("a variance divides by a count reduced before it: reduce the count's round first")
    count = counter.offset + counter.pos[name]
    first = r.pos[var[0]]
    at = r.offset + first
    if count == at - 1:
        totals = f.sums[count:at + len(var)].sum(-1)
        n, totals = totals[0], totals[1:]
    else:
        n, totals = f.sums[count].sum(), f.sums[at:at + len(var)].sum(-1)
    block = q[first:first + len(var)]
    block.addcdiv_(totals[:, None, None], n, value=-1.0)
    torch.where(r.tok.keep[RESP], block, _fill(0.0, block.dtype, block.device), out=block)
    return torch.linalg.vector_norm(block, dim=(-2, -1))


def reduce_compact(r: Rows, out: Reduced, per_seq: Sequence[str], sq: Sequence[str], var: Sequence[str]) -> None:
    """On numpy views of the rows (the compact layout's are CPU tensors): numpy's reductions cost a third of
    torch's per call on small rows, and the results need no copy."""
    f, tok = r.f, r.tok
    assert r.q is not None
    v = r.q.numpy()
    assert r.slot_rows is not None
    stored = {name: r.slot_rows[slot] for name, slot in r.layout.reduced.items()}
    kind, mm_slots, starts = r.layout.slot_kind, r.layout.mm_slots, r.starts
    fin = [stored[n] for n, slot in r.layout.reduced.items() if kind[slot] == FIN] if r.kinds > FIN else []
    with np.errstate(all="ignore"):  # inf/NaN tokens give inf/NaN results, as torch's, without a warning
        if mm_slots:
            mm = [stored[n] for n, slot in r.layout.reduced.items() if slot - starts[kind[slot]] in mm_slots]
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
            out.mx, out.mn = f.part(mx), f.part(mn)
        for a, b in _runs(sorted(fin)):  # FIN rows: zero outside the final mask
            v[a:b, tok.off_fin()] = 0.0
        totals = np.zeros(v.shape[0], dtype=v.dtype)
        for a, b in _runs(sorted(stored.values())):
            np.add.reduce(v[a:b], axis=1, out=totals[a:b])
        out.rs = f.part(totals)
        if per_seq:
            out.seq = f.part(tok.segment_sums(v, _runs(sorted(stored[n] for n in per_seq))))
        for name in sq:
            row = v[stored[name]]
            out.sq[name] = f.part(tok.segment_sums(np.square(row)[None])[0] if name in out.per_seq_rows
                                  else np.dot(row, row)[None])
        if var:
            first = stored[var[0]]
            block = v[first:first + len(var)]
            if tok.size:
                block -= totals[first:first + len(var), None] / tok.size
            out.m2_part = f.part(np.sqrt(np.einsum("ij,ij->i", block, block)))


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Ascending row indices as ``[start, stop)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs
