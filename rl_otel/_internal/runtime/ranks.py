"""Which rank a process is, and which ranks do what: decided here, never by ``if rank == 0`` scattered around.

A process's rank comes from torch.distributed's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, as
``torchrun`` and most launchers set it). Series carry one label, ``rank`` (the global rank: unique in a run and
stable across restarts); the local rank and the world size go on the OTel resource (``target_info``) only, so
the label set - and the series count - stays minimal.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
