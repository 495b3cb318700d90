"""What log() accepts: nested dicts flattened with "/", and values coerced to a float or a 1-d float array.

Heavy libraries are never imported here: torch tensors and numpy values are recognised by duck typing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from numbers import Real
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import numpy as np

from rl_otel._internal.pipeline.histogram import BucketCounts

if TYPE_CHECKING:
    import torch


class BadValue(Exception):
    """A value log() cannot use; the message says why (logged once per key, never raised to the caller)."""


_LEAVES = frozenset({float, int, bool, str, type(None)})


class BadKey:
    """Stands, in :func:`flatten`'s output, for the value of a key whose text could not be made (its ``str()``
    raised): the key is skipped and counted, the rest of the step is not."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def flatten(metrics: Mapping[Any, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    """Yield ``(key, value)`` with nested mappings joined by "/" (``{"a": {"b": 1}}`` -> ``("a/b", 1)``). A key
    that is not a str is made one with ``str()``; one whose ``str()`` raises yields a :class:`BadKey` value."""
    for key, value in metrics.items():
        if type(key) is not str:
            try:
                key = str(key)
            except Exception as exc:
                yield (f"{prefix}/?" if prefix else "?"), BadKey(f"a key whose str() raises {type(exc).__name__}")
                continue
        full = f"{prefix}/{key}" if prefix else key
        if type(value) in _LEAVES:  # the common case, without the Mapping ABC check (~0.3 us a key)
            yield full, value
        elif isinstance(value, Mapping):
            yield from flatten(value, full)
        else:
            yield full, value


def _is_torch_tensor(value: object) -> TypeGuard[torch.Tensor]:
    cls = type(value)
    return cls.__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "dim")


def coerce(value: object, *, keep_tensors: bool = False) -> float | np.ndarray | BucketCounts | torch.Tensor | None:
    """A float for a scalar, a 1-d float64 array for a distribution, ``None`` to skip silently (``None``).

    NaN and ±Inf pass through; :class:`BucketCounts` (a distribution bucketed on its device) passes unchanged;
    with ``keep_tensors`` a 1-d torch tensor stays a (detached) tensor, for :func:`as_histogram` to bucket where
    it lives. Raises ``BadValue`` for strings, objects, complex numbers, >1-d arrays and ints too large for a
    float.
    """
    if type(value) is float:  # the per-step case first
        return value
    if value is None or isinstance(value, BucketCounts):
        return value
    if isinstance(value, (bool, int, float)) or (isinstance(value, Real) and not isinstance(value, np.ndarray)):
        try:
            return float(value)
        except (OverflowError, TypeError, ValueError) as exc:
            raise BadValue(f"cannot convert {type(value).__name__} to float: {exc}") from None
    if _is_torch_tensor(value):
        if keep_tensors and value.dim() == 1 and not value.is_complex():
            return value.detach()
        return _coerce_tensor(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return _coerce_array(np.asarray(value))
    if isinstance(value, (list, tuple)):
        try:
            return _coerce_array(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadValue(f"a list that is not numbers: {exc}") from None
    raise BadValue(f"values of type {type(value).__name__} are not metrics")


def _coerce_array(arr: np.ndarray) -> float | np.ndarray:
    if arr.dtype.kind not in "biuf":
        raise BadValue(f"array of dtype {arr.dtype} is not numeric")
    if arr.ndim == 0:
        return float(arr)
    if arr.ndim > 1:
        raise BadValue(f"a {arr.ndim}-d array is neither a scalar nor a distribution")
    return arr.astype(np.float64, copy=False)


def _coerce_tensor(tensor: torch.Tensor) -> float | np.ndarray:
    if tensor.is_complex():
        raise BadValue("complex tensors are not metrics")
    if tensor.dim() == 0:
        return float(tensor.item())
    if tensor.dim() > 1:
        raise BadValue(f"a {tensor.dim()}-d tensor is neither a scalar nor a distribution")
    # float64 keeps int64 lengths and float32/bf16/fp16 values exact enough; one device->host copy.
    return tensor.detach().to(device="cpu").double().numpy()



# Up to this many values a CPU tensor is bucketed with numpy (BulkHistogram), above it with torch
# (rl_otel.stats.histogram.bucket): numpy wins on small tensors (per-op overhead), torch on large ones (threads).
SMALL_CPU_TENSOR = 8192


def is_tensor(value: object) -> TypeGuard[torch.Tensor]:
    """True for a torch tensor (recognised without importing torch)."""
    return _is_torch_tensor(value)


def as_histogram(value: object, bounds: tuple[float, ...], scale: float = 1.0) -> np.ndarray | BucketCounts:
    """A histogram key's value: a 1-d tensor is bucketed on its device against ``bounds`` (only the counts cross
    to the host); other values become a 1-d float64 array; ``BucketCounts`` must have been bucketed against
    ``bounds`` (raises ``BadValue`` otherwise, and for a scale other than 1, which its bounds cannot carry)."""
    if isinstance(value, BucketCounts):
        if scale != 1.0 or tuple(value.bounds) != tuple(bounds):
            raise BadValue(f"bucketed with bounds {list(value.bounds)}, but the histogram's are {list(bounds)}"
                           + (f" (scale {scale})" if scale != 1.0 else ""))
        return value
    if _is_torch_tensor(value):
        if value.device.type != "cpu" or value.numel() > SMALL_CPU_TENSOR:
            from rl_otel.stats.histogram import bucket  # torch is already imported: the value is a tensor

            return bucket(value * scale if scale != 1.0 else value, bounds)
        # A small CPU tensor: numpy buckets it in one pass at a fraction of a dozen torch ops' dispatch cost.
        arr = cast("np.ndarray", _coerce_tensor(value.reshape(-1)))  # 1-d: never the scalar branch
        return arr * scale if scale != 1.0 else arr
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
    return arr * scale if scale != 1.0 else arr


def to_tracker_array(value: object) -> np.ndarray | None:
    """What a tracker gets for a histogram key: a 1-d float64 copy of the values (``None`` for ``BucketCounts``,
    whose values are gone; ``ppo_stats(distributions="tensors")`` keeps them for trackers)."""
    if isinstance(value, BucketCounts):
        return None
    if _is_torch_tensor(value):
        arr = cast("np.ndarray", _coerce_tensor(value.reshape(-1)))  # 1-d: never the scalar branch
        # a float64 CPU tensor converts without a copy: the tracker thread, which reads the array later, must not
        # see the caller's in-place changes made after log() returned
        return arr.copy() if arr.size and arr.ctypes.data == value.data_ptr() else arr
    return np.atleast_1d(np.array(value, dtype=np.float64))


_SCALAR, _BUCKETS, _VALUES = 0, 1, 2
# bounds and scale of a histogram key, or None for another key (the ingest's route, asked only for 1-d tensors)
HistogramOf = Callable[[str], "tuple[tuple[float, ...], float] | None"]


def on_device(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor`` on the host is a device-to-host copy (a host sync on a GPU)."""
    return tensor.device.type != "cpu"


def to_host(pairs: Iterable[tuple[str, object]], histogram: HistogramOf, *, keep_values: bool) -> list[tuple[str,
                                                                                                          object]]:
    """``pairs`` with their tensors' values read with one device-to-host copy per device (on a GPU each copy is a
    host sync: one per ``log()`` and device instead of one per key). The 0-d tensors of a device (CPU ones too:
    one ``tolist`` instead of an ``item()`` each) become floats; a 1-d tensor on a GPU, under a histogram key,
    becomes its :class:`BucketCounts` bucketed on the device (only the counts cross), or a float64 array of its
    values when they are needed on the host (``keep_values``: the trackers draw their own histograms; a key with
    a unit scale), as do the 1-d tensors of other keys. Whatever cannot be read here (a complex tensor, a sparse
    one, a failing op) is left as it was, for the per-key path to read or reject. Never raises."""
    out = pairs if isinstance(pairs, list) else list(pairs)
    groups: dict[Any, list[tuple[int, int, Any, tuple[float, ...]]]] = {}
    for i, (key, value) in enumerate(out):
        if type(value) in _LEAVES or not _is_torch_tensor(value):
            continue
        try:
            if value.is_complex() or value.layout != _strided(value):
                continue
            dim = value.dim()
            if dim == 0:
                groups.setdefault(value.device, []).append((i, _SCALAR, value.detach().reshape(1), ()))
            elif dim == 1 and on_device(value):
                found = histogram(key)
                if found is not None and found[1] == 1.0 and not keep_values:
                    from rl_otel.stats.histogram import bucket_vector  # torch is imported: the value is a tensor

                    groups.setdefault(value.device, []).append((i, _BUCKETS, bucket_vector(value, found[0]),
                                                                found[0]))
                else:
                    groups.setdefault(value.device, []).append((i, _VALUES, value.detach(), ()))
        except Exception:
            continue
    for items in groups.values():
        try:
            torch = sys.modules["torch"]
            parts = [part.reshape(-1).to(torch.float64) for _, _, part, _ in items]
            flat = parts[0] if len(parts) == 1 else torch.cat(parts)
            if all(kind == _SCALAR for _, kind, _, _ in items):
                host: Any = flat.tolist()  # the one copy; floats at once
            else:
                host = flat.cpu().numpy()  # the one copy
        except Exception:
            continue
        at = 0
        for i, kind, part, bounds in items:
            n = part.numel()
            chunk = host[at:at + n]
            at += n
            key = out[i][0]
            if kind == _SCALAR:
                out[i] = (key, float(chunk[0]))
            elif kind == _BUCKETS:
                out[i] = (key, BucketCounts.from_vector(bounds, [float(v) for v in chunk]))
            else:
                out[i] = (key, np.asarray(chunk, dtype=np.float64))
    return out


def _strided(tensor: torch.Tensor) -> Any:
    return sys.modules["torch"].strided


def owned(value: object) -> object:
    """``value``, or a copy of it if the caller could change it after ``log()`` returns (a tensor, an array, a
    list): for a ``log()`` the metrics worker runs later. A tensor is cloned where it lives (no host sync)."""
    if type(value) in _LEAVES:
        return value
    if _is_torch_tensor(value):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return list(value)
    return value
