"""Which rank a process is, and which ranks do what: decided here, never by ``if rank == 0`` scattered around.

A process's rank comes from torch.distributed's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, as
``torchrun`` and most launchers set it). Series carry one label, ``rank`` (the global rank: unique in a run and
stable across restarts); the local rank and the world size go on the OTel resource (``target_info``) only, so
the label set - and the series count - stays minimal.

Which launch a process belongs to (:func:`launch_identity`) is decided here too: the ranks of one launch must
derive one run label without being told one, and two launches must never derive the same.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rl_otel.errors import ConfigurationError

TrackerRanks = int | str | Iterable[int]


@dataclass(frozen=True)
class ProcessRanks:
    """Where this process sits in a distributed job (``rank 0 of 1`` outside one)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = env.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"the {name} environment variable must be an int, got {text!r}") from None
    if value < minimum:
        raise ConfigurationError(f"the {name} environment variable must be >= {minimum}, got {text!r}")
    return value


def env_ranks(env: Mapping[str, str] | None = None) -> ProcessRanks:
    """``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from ``env`` (default ``os.environ``); absent ones default to
    0, 0 and 1. Raises ConfigurationError naming a variable that is not a valid int (or a rank >= WORLD_SIZE)."""
    env = os.environ if env is None else env
    ranks = ProcessRanks(rank=_env_int(env, "RANK", 0, 0), local_rank=_env_int(env, "LOCAL_RANK", 0, 0),
                         world_size=_env_int(env, "WORLD_SIZE", 1, 1))
    if "WORLD_SIZE" in env and ranks.rank >= ranks.world_size:
        raise ConfigurationError(f"RANK={ranks.rank} is not below WORLD_SIZE={ranks.world_size}")
    return ranks


def serving_port(port: int, local_rank: int, add_local_rank: bool | None = None) -> int:
    """The port this process serves its scrape endpoint on: ``port`` is a base, offset by ``LOCAL_RANK``.

    Processes of one host share its ports, so ``torchrun --nproc_per_node N`` with ``port`` 9464 (given or the
    default) serves local ranks 0..N-1 on 9464..9463+N - no two take the same port, and a host is scraped at a fixed
    range. Outside a launcher ``LOCAL_RANK`` is unset (0): the port as given. ``add_local_rank=False`` serves on
    ``port`` itself (one network namespace per process, e.g. a pod per rank); ``None`` (not given) means True. Port
    0 (a free port) is never offset: every process already gets its own. Raises ConfigurationError for
    ``add_local_rank=True`` with port 0, and past 65535.
    """
    if add_local_rank is None:
        add_local_rank = port != 0
    if not add_local_rank:
        return port
    if port == 0:
        raise ConfigurationError("prometheus add_local_rank needs a base port, got port 0 (port 0 is a free "
                                 "port for every rank already)")
    if port + local_rank > 65535:
        raise ConfigurationError(f"prometheus port {port} + LOCAL_RANK {local_rank} is past 65535")
    return port + local_rank


def local_world_size(env: Mapping[str, str] | None = None) -> int:
    """``LOCAL_WORLD_SIZE`` (how many processes of the launch run on this host; torchrun, accelerate and DeepSpeed
    set it), 1 when unset. Raises ConfigurationError naming a value that is not an int >= 1."""
    return _env_int(os.environ if env is None else env, "LOCAL_WORLD_SIZE", 1, 1)


def port_lane(port: int, local_rank: int, local_world_size: int, search: int) -> range:
    """The base ports (before ``LOCAL_RANK`` is added) a process tries, in order, when its port may be taken:
    ``port``, ``port + L``, ``port + 2L``, ... (``L`` = ``local_world_size``) while the port served,
    ``base + local_rank``, stays within ``port + local_rank + search`` and 65535.

    Each local rank keeps to its own lane of ports, ``port + LOCAL_RANK + k * L``: a taken port moves only the
    rank whose port it is, never the ranks above it (a search in steps of 1 would push rank 1 off its port when
    rank 0 moved onto it), and the ranks of a host together use no port outside ``port .. port + search + L - 1``.
    """
    step = max(1, local_world_size)
    last = min(port + search, 65535 - local_rank)
    return range(port, last + 1, step) if port else range(0, 1)


# -- which launch --------------------------------------------------------------------------------------------

LAUNCH_KEY = "rl_otel/launch"  # the key the ranks of one launch agree on in the launcher's store
STORE_TIMEOUT_S = 10.0  # a store found listening answers in milliseconds; this bounds a stuck one


def launch_identity(env: Mapping[str, str] | None = None) -> str | None:
    """What identifies this process's multi-process launch: alike on every rank of the launch, different for
    every other launch (two ``torchrun`` runs on the same master port days apart). ``None`` outside a launch
    (``WORLD_SIZE`` unset or 1).

    - **The launcher's store** (``store:<token>``): the TCPStore at ``MASTER_ADDR:MASTER_PORT`` that torchrun's
      agent hosts for the whole launch (``TORCHELASTIC_USE_AGENT_STORE=True``), or rank 0 hosts once the process
      group is initialized. Each rank proposes a random token with ``compare_set``; the first proposal is kept
      and every rank reads it back - on every node, and across the agent's worker restarts (the store outlives
      them), while a new launch starts a new, empty store. No rank waits for another.
    - **Else the launcher process on this host** (``launcher:<pid>@<start time>``, with ``TORCHELASTIC_RUN_ID``
      and ``MASTER_ADDR:MASTER_PORT``): the parent process that started the ranks, told apart from a later
      process with the same pid by its start time. Shared by the ranks one launcher started (a node's agent,
      ``mp.spawn``'s parent); ranks on several nodes without a reachable store get one label per node.
    """
    env = os.environ if env is None else env
    if env.get("WORLD_SIZE", "1").strip() in ("", "0", "1"):
        return None
    token = _store_token(env)
    if token is not None:
        return f"store:{token}"
    import psutil

    try:
        parent = psutil.Process(os.getppid())
        launcher = f"{parent.pid}@{parent.create_time()!r}"
    except (psutil.Error, OSError):
        launcher = str(os.getppid())
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    return f"launcher:{launcher}|{run_id}|{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"


def _store_token(env: Mapping[str, str]) -> str | None:
    """The launch's token in the launcher's TCPStore (see :func:`launch_identity`), or ``None`` when no store can
    be there: no ``MASTER_ADDR``/``MASTER_PORT``, torch not loaded (a launch with a store runs torch), neither an
    agent store nor an initialized process group, nothing listening, or any error talking to it."""
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    dist: Any = sys.modules.get("torch.distributed")
    try:
        if dist is None and agent_store:  # torchrun started us: torch is there, loaded by the training soon anyway
            dist = importlib.import_module("torch.distributed")
        if dist is None or not dist.is_available() or not (agent_store or dist.is_initialized()):
            return None
        # a plain connect first: where nothing listens (a process group initialized from a file:// store), the
        # TCPStore client would retry for its whole timeout and print C++ errors
        with socket.create_connection((host, int(port)), timeout=STORE_TIMEOUT_S):
            pass
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))
        token = store.compare_set(LAUNCH_KEY, "", uuid.uuid4().hex)
    except Exception:  # boundary: sockets and torch.distributed's TCPStore
        return None
    return token.decode("ascii", "replace") if isinstance(token, bytes) else str(token)


def check_tracker_ranks(policy: object) -> int | str | frozenset[int]:
    """``policy`` in its checked form: an int rank, ``"all"``, or a frozenset of ranks. Raises ConfigurationError."""
    if policy == "all":
        return "all"
    if isinstance(policy, bool):
        raise ConfigurationError(f"tracker_ranks must be a rank, a list of ranks or 'all', got {policy!r}")
    if isinstance(policy, int):
        if policy < 0:
            raise ConfigurationError(f"tracker_ranks must be >= 0, got {policy!r}")
        return policy
    if isinstance(policy, Iterable) and not isinstance(policy, (str, bytes)):
        ranks = list(policy)
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            raise ConfigurationError(f"tracker_ranks must be a non-empty list of ranks >= 0, got {policy!r}")
        return frozenset(ranks)
    raise ConfigurationError(f"tracker_ranks must be a rank, a list of ranks or 'all', got {policy!r}")


def mirrors_to_trackers(rank: int, policy: int | str | frozenset[int]) -> bool:
    """True if ``rank`` mirrors its metrics to the trackers (TensorBoard, WandB, ...).

    Every rank exports to Prometheus (its series carry a ``rank`` label); trackers get one writer per run by
    default - rank 0 - because N ranks writing one WandB run or TensorBoard directory interleave and collide.
    """
    if policy == "all":
        return True
    if isinstance(policy, int):
        return rank == policy
    return rank in policy
