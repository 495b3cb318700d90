"""Which ranks do what: decided here, in one pure function, never by ``if rank == 0`` scattered around."""

from __future__ import annotations

from collections.abc import Iterable

from rl_otel.errors import ConfigurationError

TrackerRanks = int | str | Iterable[int]


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
