"""Read back what the trackers and the scrape endpoint hold, with each tool's own reader and format."""

from __future__ import annotations

import glob
import os
import struct
import urllib.request
from collections import defaultdict


def scrape_series(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` from the Prometheus text exposition (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def tensorboard_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _leveldb_records(path: str, ident: bytes):
    """Records of a W&B/SwanLab datastore file: LevelDB log format, 32 KiB blocks, 7-byte record headers."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == ident, data[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if length == 0 and kind == 0:
            pos += (block - pos % block) % block
            continue
        if pos + length > len(data):  # a record still being written
            return
        chunk, pos = data[pos:pos + length], pos + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def wandb_history(wandb_dir: str) -> dict[int, dict[str, object]]:
    """``{step: {key: value}}`` from the offline run's ``.wandb`` file, parsed with wandb's own protobufs.

    wandb-core writes the file from its own process; the reader waits (up to 30 s) for the run's ``exit`` record.
    """
    import json
    import time

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    for _ in range(300):
        records = []
        for data in _leveldb_records(path, b":W&B"):
            rec = pb.Record()
            rec.ParseFromString(data)
            records.append(rec)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.1)
    rows: dict[int, dict[str, object]] = defaultdict(dict)
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            row = rows[rec.history.step.num]
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if len(item.nested_key) > 1:  # a media/histogram object: key, field
                    row.setdefault(item.nested_key[0], {})[item.nested_key[1]] = json.loads(item.value_json)
                else:
                    row[key] = json.loads(item.value_json)
    return dict(rows)


def wandb_config(wandb_dir: str) -> dict[str, object]:
    """The run's config as the offline ``.wandb`` file holds it (its run record, then its config records), read
    with wandb's own protobufs (call after the run finished, e.g. after :func:`wandb_history`)."""
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    config: dict[str, object] = {}
    for data in _leveldb_records(path, b":W&B"):
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind in ("run", "config"):  # the run record holds the config of wandb.init; config records, updates
            for item in (rec.run.config if kind == "run" else rec.config).update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


def swanlab_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(step, value)]}`` from the offline run's ``.swanlab`` file, read with SwanLab's DataStoreReader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(os.path.join(log_dir, "run-*", "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for data in reader:
        rec = Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "scalar":
            out[rec.scalar.key].append((rec.scalar.step, rec.scalar.value.number))
    reader.close()
    return dict(out)
