"""Series rl_otel writes itself around phases, and live gauges read at scrape time (process and GPU memory).

Keys live under ``rl_otel/`` (nobody logs them); the entries exist so names, units and labels are defined in one
place, documented by ``rl-otel catalog`` and checked like every other entry.
"""

from __future__ import annotations

from rl_otel.catalog.define import DURATION_BUCKETS, counter, gauge, histogram
from rl_otel.catalog.goodput import BUCKETS

_S = "rl_otel"
_PARTS = "{part:total|execute|onload|offload}"

PHASE_DURATION = histogram(
    f"rl_otel/phase_duration/{{cluster}}/{{phase}}/{_PARTS}", "rl_phase_duration_seconds",
    "Duration of every run of a cluster's phase: total, execute (the work), onload or offload of model state.",
    _S, DURATION_BUCKETS, unit="s")
# The same parts timed on the GPU (CUDA events on the phase's stream, resolved after the phase ended), beside the
# host time above: the host time of a GPU phase is mostly how long its kernels took to launch.
PHASE_GPU_DURATION = histogram(
    f"rl_otel/phase_gpu_duration/{{cluster}}/{{phase}}/{_PARTS}", "rl_phase_gpu_duration_seconds",
    "GPU time of every run of a cluster's phase (CUDA events on its stream; only in processes using CUDA): total, "
    "execute (the work), onload or offload of model state.", _S, DURATION_BUCKETS, unit="s")

# Process view of the GPU (torch's caching allocator, this process only); device_id is the CUDA ordinal.
GPU_PROCESS_ALLOCATED = gauge(
    "rl_otel/live/gpu_process/{device_id}/allocated", "rl_gpu_process_memory_allocated_bytes",
    "GPU memory held by tensors of this process on a device (torch.cuda.memory_allocated), read at scrape time.",
    _S, unit="By")
GPU_PROCESS_RESERVED = gauge(
    "rl_otel/live/gpu_process/{device_id}/reserved", "rl_gpu_process_memory_reserved_bytes",
    "GPU memory reserved by torch's caching allocator in this process on a device (torch.cuda.memory_reserved).",
    _S, unit="By")
# Device view (NVML, every process on the device); gpu_uuid joins DCGM's UUID label.
GPU_DEVICE_USED = gauge(
    "rl_otel/live/gpu_device/{device_id}/{gpu_uuid}/used", "rl_gpu_device_memory_used_bytes",
    "GPU memory in use on the device by all processes (NVML), polled in the background.", _S, unit="By")
GPU_DEVICE_TOTAL = gauge(
    "rl_otel/live/gpu_device/{device_id}/{gpu_uuid}/total", "rl_gpu_device_memory_total_bytes",
    "Total memory of the GPU device (NVML).", _S, unit="By")
GPU_DEVICE_RESERVED = gauge(
    "rl_otel/live/gpu_device/{device_id}/{gpu_uuid}/reserved", "rl_gpu_device_memory_reserved_bytes",
    "GPU memory reserved by the driver and firmware on the device (NVML v2 memory info; absent on older drivers).",
    _S, unit="By")
# Named with rl_ so they never clash with prometheus_client's own process_resident_memory_bytes.
PROCESS_RSS = gauge("rl_otel/live/process/rss", "rl_process_resident_memory_bytes",
                    "Resident set size of the training process (psutil), read at scrape time.", _S, unit="By")
PROCESS_VMS = gauge("rl_otel/live/process/vms", "rl_process_virtual_memory_bytes",
                    "Virtual memory size of the training process (psutil), read at scrape time.", _S, unit="By")


# Where the time goes (rl_otel/_internal/pipeline/goodput.py, docs/goodput.md): counters computed at scrape time
# from the process's phases, tel.collective() blocks and logged timing keys, so the time that runs now (a phase
# still running, the idle time since the last one) is in them at every scrape.
GOODPUT_BUCKET = counter(
    f"rl_otel/goodput/bucket/{{bucket:{'|'.join(BUCKETS)}}}", "rl_goodput_bucket_seconds",
    "Seconds of this process's wall time in each goodput bucket (generation, training and inference are "
    "productive; startup, weight_sync, offload, validation, checkpointing, other and waiting are not): from its "
    "phases (exclusive time), tel.collective() blocks (waiting), the frameworks' timing keys and the time in no "
    "phase. The buckets of a process add up to rl_goodput_wall_seconds_total.", _S, unit="s")
GOODPUT_WALL = counter(
    "rl_otel/goodput/wall", "rl_goodput_wall_seconds",
    "The wall seconds the goodput buckets divide: process start to now for a process with phases, the sum of the "
    "logged step durations (and start-up) for one known only by its timing keys.", _S, unit="s")
COLLECTIVE_WAIT = counter(
    "rl_otel/collective_wait/{point}", "rl_collective_wait_seconds",
    "Seconds this rank spent blocked where ranks meet: inside tel.collective(point) blocks (an all-reduce, a "
    "barrier); the rank the others wait for waits least.", _S, unit="s")
RANK_COMPUTE = counter(
    "rl_otel/rank_compute", "rl_rank_compute_seconds",
    "Seconds this rank was busy in its phases, its tel.collective() waits (and phases of the waiting bucket) left "
    "out: a slow rank computes longer for the same steps, while the phases' durations are equalised by the "
    "collectives.", _S, unit="s")

SPECS = (PHASE_DURATION, PHASE_GPU_DURATION, GPU_PROCESS_ALLOCATED, GPU_PROCESS_RESERVED, GPU_DEVICE_USED,
         GPU_DEVICE_TOTAL, GPU_DEVICE_RESERVED, PROCESS_RSS, PROCESS_VMS, GOODPUT_BUCKET, GOODPUT_WALL, COLLECTIVE_WAIT,
         RANK_COMPUTE)
