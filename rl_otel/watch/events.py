"""The scalars of one TensorBoard ``Event``, parsed with TensorBoard's own protos.

Scalars come as ``summary.value[].simple_value`` (torch's ``SummaryWriter``, tensorboardX, TF1) or as a scalar
``tensor`` (TF2's ``tf.summary.scalar``, any numeric dtype, in ``*_val`` fields or ``tensor_content``). Images,
histograms, text and graphs are not metrics of the catalog: they are passed over.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# TensorFlow's DataType numbers (tensorboard/compat/proto/types.proto) of the numeric dtypes a scalar may have
_DTYPES: dict[int, tuple[Any, str]] = {
    1: (np.float32, "float_val"), 2: (np.float64, "double_val"), 3: (np.int32, "int_val"),
    4: (np.uint8, "int_val"), 5: (np.int16, "int_val"), 6: (np.int8, "int_val"), 9: (np.int64, "int64_val"),
    10: (np.bool_, "bool_val"), 14: (np.float16, "half_val"), 17: (np.uint16, "int_val"),
    19: (np.float16, "half_val"), 22: (np.uint32, "uint32_val"), 23: (np.uint64, "uint64_val"),
}
_event_class: Any = None


def event_class() -> Any:
    """TensorBoard's ``Event`` message class (raises ImportError naming the package when it is missing)."""
    global _event_class
    if _event_class is None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
        except ImportError as exc:
            raise ImportError("reading TensorBoard event files needs the tensorboard package: "
                              "pip install 'rl_otel[tensorboard]'") from exc
        _event_class = Event
    return _event_class


def scalars(data: bytes) -> tuple[int, float, dict[str, float]] | None:
    """``(step, wall_time, {tag: value})`` of an Event record with scalar summary values, else ``None``.
    Raises on bytes that are no Event (the caller counts the record as corrupt)."""
    event = event_class().FromString(data)
    if not event.HasField("summary"):
        return None
    values: dict[str, float] = {}
    for v in event.summary.value:
        kind = v.WhichOneof("value")
        if kind == "simple_value":
            values[v.tag] = v.simple_value
        elif kind == "tensor":
            x = _tensor_scalar(v.tensor)
            if x is not None:
                values[v.tag] = x
    return (event.step, event.wall_time, values) if values else None


def _tensor_scalar(tensor: Any) -> float | None:
    """A one-element numeric tensor's value as a float, else ``None`` (strings, images, vectors)."""
    found = _DTYPES.get(tensor.dtype)
    if found is None:
        return None
    dtype, field = found
    if tensor.tensor_content:
        arr = np.frombuffer(tensor.tensor_content, dtype=dtype)
    else:
        vals = getattr(tensor, field)
        if field == "half_val":  # float16 bits held in int32s
            arr = np.asarray(list(vals), dtype=np.uint16).view(np.float16)
        else:
            arr = np.asarray(list(vals), dtype=dtype)
    if arr.size != 1:
        return None
    return float(arr.reshape(-1)[0])
