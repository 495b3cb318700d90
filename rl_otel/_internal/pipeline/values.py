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
            except Exception as exc:  # boundary: user code (the key's __str__)
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


_BUCKETS, _VALUES = 1, 2
# bounds and scale of a histogram key, or None for another key (the ingest's route, asked only for 1-d tensors)
HistogramOf = Callable[[str], "tuple[tuple[float, ...], float] | None"]


def on_device(value: object) -> bool:
    """Whether ``value`` is a tensor whose reading on the host is a device-to-host copy (a host sync on a GPU);
    one attribute read (``Tensor.is_cpu``), the filter a ``log()`` runs on every value that is not a number."""
    return getattr(value, "is_cpu", True) is False


def to_host(pairs: Iterable[tuple[str, object]], histogram: HistogramOf, *, keep_values: bool) -> list[tuple[str,
                                                                                                          object]]:
    """``pairs`` with the values of their GPU tensors read with one device-to-host copy per device (each copy is a
    host sync: one per ``log()`` and device instead of one per key). A 0-d tensor becomes a float (those of a
    device are stacked per dtype, then copied together); a 1-d tensor under a histogram key becomes its
    :class:`BucketCounts`, bucketed on the device (only the counts cross), or a float64 array of its values when
    they are needed on the host (``keep_values``: the trackers draw their own histograms; a key with a scale), as
    do the 1-d tensors of other keys. CPU tensors are left to the per-key path (reading one costs no sync, and
    ``item()`` is cheaper there than stacking), as is whatever cannot be read here (a complex tensor, a sparse one,
    a failing op). Never raises."""
    out = pairs if isinstance(pairs, list) else list(pairs)
    devices: dict[Any, _DeviceValues] = {}
    for i, (key, value) in enumerate(out):
        if not on_device(value) or not _is_torch_tensor(value):
            continue
        try:
            if value.is_complex() or value.layout is not _strided(value):
                continue
            dim = value.dim()
            if dim == 0:
                found = devices.setdefault(value.device, _DeviceValues())
                found.scalars.setdefault(value.dtype, []).append((i, value))
            elif dim == 1:
                bounds = histogram(key)
                if bounds is not None and bounds[1] == 1.0 and not keep_values:
                    from rl_otel.stats.histogram import bucket_vector  # torch is imported: the value is a tensor

                    part = bucket_vector(value, bounds[0])
                    devices.setdefault(value.device, _DeviceValues()).vectors.append((i, _BUCKETS, part, bounds[0]))
                else:
                    devices.setdefault(value.device, _DeviceValues()).vectors.append((i, _VALUES, value, ()))
        except Exception:  # boundary: the user's tensor (torch: device, dtype, bucketing of any value)
            continue
    for found in devices.values():
        try:
            found.read(out)
        except Exception:  # boundary: torch/CUDA (the device-to-host copy of one device's values)
            continue
    return out


class _DeviceValues:
    """The tensors of one device a ``log()`` reads: 0-d ones by dtype, and 1-d parts (bucket vectors, values)."""

    __slots__ = ("scalars", "vectors")

    def __init__(self) -> None:
        self.scalars: dict[Any, list[tuple[int, Any]]] = {}
        self.vectors: list[tuple[int, int, Any, tuple[float, ...]]] = []

    def read(self, out: list[tuple[str, object]]) -> None:
        """Copy everything to the host at once (a stack per dtype, a cat, one copy) and put the values in
        ``out``."""
        torch = sys.modules["torch"]
        with torch.no_grad():
            parts = [torch.stack([t for _, t in group]).to(torch.float64) for group in self.scalars.values()]
            parts += [part.reshape(-1).to(torch.float64) for _, _, part, _ in self.vectors]
            flat = parts[0] if len(parts) == 1 else torch.cat(parts)
            host: Any = flat.tolist() if not self.vectors else flat.cpu().numpy()  # the one copy
        at = 0
        for group in self.scalars.values():
            for i, _ in group:
                out[i] = (out[i][0], float(host[at]))
                at += 1
        for i, kind, part, bounds in self.vectors:
            n = part.numel()
            chunk = host[at:at + n]
            at += n
            if kind == _BUCKETS:
                out[i] = (out[i][0], BucketCounts.from_vector(bounds, [float(v) for v in chunk]))
            else:
                out[i] = (out[i][0], np.asarray(chunk, dtype=np.float64))


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
