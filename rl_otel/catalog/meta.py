"""rl_otel's own series: liveness and self-monitoring. Keys under ``rl_otel/`` are written by rl_otel itself."""

from __future__ import annotations

from rl_otel.catalog.define import counter, gauge
from rl_otel.catalog.spec import Kind, MetricSpec

_S = "rl_otel"

STEP = gauge("rl_otel/step", "rl_step", "Training step of the last log() call.", _S, unit="{step}")
LAST_STEP_TIMESTAMP = gauge("rl_otel/last_step_timestamp", "rl_last_step_timestamp_seconds",
                            "Unix time of the last log() call: tells a hung trainer from a slow one.", _S, unit="s")
ERRORS = counter("rl_otel/errors/{sink}/{reason}", "rl_telemetry_errors",
                 "Errors rl_otel absorbed instead of stopping training, by sink and reason.", _S, unit="{error}")
DROPPED_SERIES = counter("rl_otel/dropped_series/{metric}", "rl_telemetry_dropped_series",
                         "Values dropped because a metric reached its series cap or its name collided.", _S,
                         unit="{series}")

# Present while a tel.phase() block runs, removed when it ends: which phase is in progress and since when (a stuck
# phase is named by the alert that reads it). Served at scrape time from the phases' own state.
PHASE_STARTED = gauge("rl_otel/phase_started/{cluster}/{phase}", "rl_phase_started_timestamp_seconds",
                      "Unix time a running phase of a cluster started (the earliest, if several of this process run "
                      "it); absent when no such phase runs.", _S, unit="s")

# Hangs with evidence (rl_otel/_internal/probes/hangs.py): a stack dump written when a phase ran far past its usual
# duration, or on demand (a signal, GET /debug/stacks), and the last time this process made progress. Served at
# scrape time from the hang watch's own state.
STACK_DUMP_REASONS = ("stuck", "signal", "http")  # every one served from the start (at 0): increase() sees the first
STACK_DUMPS = counter("rl_otel/stack_dumps/{reason}", "rl_stack_dumps",
                      "Stack dumps this process wrote, by reason: stuck (a phase ran far past its usual duration), "
                      "signal (SIGUSR1 by default), http (GET /debug/stacks).", _S, unit="{dump}")
STACK_DUMP_INFO = gauge("rl_otel/stack_dump_info/{reason}/{cluster}/{phase}/{path:.+}", "rl_stack_dump_info",
                        "Always 1: the last stack dump this process wrote (one series, replaced at each dump): the "
                        "file's path, the phase it was written for (empty on demand with no phase running) and why.",
                        _S)
LAST_PROGRESS = gauge("rl_otel/last_progress_timestamp", "rl_last_progress_timestamp_seconds",
                      "Unix time of this process's last progress: a logged step or a finished phase (a rollout "
                      "engine alive but making no progress shows as an old value).", _S, unit="s")

# 0 while the process serves a run, 1 once its close() began: the endpoint's end of a run that finished normally is
# told apart from a killed one (RLScrapeTargetDown reads its last scraped value for static targets).
RUN_FINISHED = gauge("rl_otel/run_finished", "rl_run_finished",
                     "0 while this process runs, 1 from its close() on (served until the endpoint stops, which waits "
                     "for one more scrape): a target whose last value is 1 ended normally; one that went down at 0 "
                     "was killed.", _S)

PROGRESS = counter("rl_otel/progress", "rl_progress",
                   "Progress events of this process (logged steps and finished phases): with "
                   "rl_last_progress_timestamp_seconds, the mean interval between them.", _S, unit="{event}")

# What this rank's torch.distributed collectives are doing (rl_otel/_internal/probes/torch_collectives.py: torch's
# flight recorder, no user code): how many it issued per process group, and the one it is in now, since when. In a
# hang, the ranks inside collective N of a group wait for the rank that issued only N-1: RLCollectiveHang names it.
COLLECTIVES = counter("rl_otel/collectives/{group}", "rl_collectives",
                      "Collectives this rank issued in a torch.distributed process group (torch's own sequence "
                      "number of the group's last enqueued collective).", _S, unit="{collective}")
COLLECTIVE_STARTED = gauge("rl_otel/collective_started/{group}/{op}", "rl_collective_started_timestamp_seconds",
                           "Unix time the oldest collective of a process group this rank issued and has not seen "
                           "complete was enqueued (op: torch's name of it, gloo:all_reduce, nccl:all_reduce); absent "
                           "when the rank is in none.", _S, unit="s")

BUILD_INFO = gauge("rl_otel/build_info/{version}", "rl_otel_build_info",
                   "Always 1; the version label says which rl_otel serves the endpoint.", _S)

SPECS = (STEP, LAST_STEP_TIMESTAMP, ERRORS, DROPPED_SERIES, PHASE_STARTED, STACK_DUMPS, STACK_DUMP_INFO, LAST_PROGRESS,
         PROGRESS, COLLECTIVES, COLLECTIVE_STARTED, BUILD_INFO, RUN_FINISHED)

# Prometheus' target_info: the OTel resource's attributes as labels (no run/rank: rl_run and rl_rank are among them).
# Not a catalog entry: no key logs it; the Telemetry writes it into its store at init.
TARGET_INFO = MetricSpec(key="rl_otel/target_info", name="target_info", kind=Kind.INFO, unit="",
                         description="Target metadata", source=_S)
