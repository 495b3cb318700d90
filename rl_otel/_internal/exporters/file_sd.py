"""Publish the endpoint in a Prometheus ``file_sd_configs`` targets file, so ranks on ephemeral ports are found.

Each process writes its own file, ``<dir>/rl_otel-<run>-<role>-rank<rank>-<id>.json``: run and role readable (other
than ASCII letters, digits, ``_.-`` replaced by ``_``), ``<id>`` a short hash of the exact run, role, rank, host
name and the target itself (host:port), so two processes never write one file - not Trinity's explorer and trainer
(one run, both rank 0), not two runs whose names read alike (``实验`` and ``测试``), not two ranks of one host.
Prometheus reads them all with ``files: [<dir>/*.json]``. A file is replaced atomically
(:mod:`rl_otel._internal.atomic`): Prometheus watches the directory and must never read half a file. ``close()``
removes it, so a finished run's targets disappear instead of turning ``up == 0``. A killed process runs no
``close()``: its file would name a dead target (``up == 0``, RLScrapeTargetDown) until someone deleted it, so the
next process that publishes in the directory reaps it - a file whose hidden owner labels (``__rl_otel_host``,
``__rl_otel_pid``: Prometheus drops ``__`` labels after relabelling) name this host and a process that no longer
exists. Files of other hosts, and files without owner labels, are left alone. The target group's labels ``run``
and ``rank`` make ``up`` (which the endpoint cannot label itself) per rank; scrape with ``honor_labels: true`` so
the series' own run/rank (the same values) are kept as they are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from rl_otel._internal.atomic import atomic_write
from rl_otel.errors import ConfigurationError

_log = logging.getLogger("rl_otel")
_SUFFIXES = (".json", ".yml", ".yaml")


def targets_path(where: str, run: str, rank: int, *, role: str, host: str, target: str) -> Path:
    """The file this process writes: ``where`` itself when it names a ``.json``/``.yml`` file, else a file of
    its own in the directory ``where`` (see the module's doc)."""
    path = Path(where).expanduser()
    if path.suffix in _SUFFIXES and not path.is_dir():
        return path
    identity = "\0".join((run, role, str(rank), host, target)).encode("utf-8", "backslashreplace")
    digest = hashlib.sha256(identity).hexdigest()[:10]
    return path / f"rl_otel-{_readable(run)}-{_readable(role)}-rank{rank}-{digest}.json"


def _readable(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64]


class TargetsFile:
    """The targets file of one endpoint; written at construction, removed by the idempotent ``close()``."""

    def __init__(self, path: Path, target: str, labels: dict[str, str], owner: str | None = None) -> None:
        """Raises :class:`ConfigurationError` naming the file when it cannot be written (read-only directory, no
        permission, a file where a directory should be): ``init()`` fails with a configuration error, not a bare
        ``OSError``. ``owner``: this host's name; a file of its own in a directory (``rl_otel-*``, not a file the
        user named) then records it and this process's id, and the files of this host's dead processes in the
        directory are removed."""
        self.path = path
        owner = owner if path.name.startswith("rl_otel-") else None
        if owner is not None:
            labels = {**labels, OWNER_HOST: owner, OWNER_PID: str(os.getpid())}
        groups = [{"targets": [target], "labels": labels}]
        text = json.dumps(groups, indent=2) + "\n" if path.suffix == ".json" else _yaml(groups)
        try:
            self._write(text)
        except OSError as exc:
            raise ConfigurationError(f"prometheus.file_sd targets file {path} cannot be written: "
                                     f"{exc.strerror or exc}") from exc
        # the file this process wrote, by identity: a restarted rank writing the very same bytes still makes a
        # new file (os.replace), which close() must leave alone
        self._identity = _identity(path)
        self._closed = False
        self._pid = os.getpid()  # a forked child's close() leaves the file to the process that serves the target
        if owner is not None:
            for reaped in reap_dead(path.parent, owner, keep=path):
                _log.info("rl_otel: removed %s: the process that served its target is gone", reaped)

    def _write(self, text: str) -> None:
        """Replace the file with ``text`` atomically (Prometheus never reads half a file), readable by the
        Prometheus server's user."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.path, mode=0o644) as f:
            f.write(text)

    def close(self) -> None:
        """Remove the file, unless another process has replaced it since (a restarted rank owns it now), or this
        is a forked child (the endpoint the file names is its parent's)."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return
        try:
            if _identity(self.path) == self._identity:
                self.path.unlink()
        except OSError as exc:
            _log.debug("rl_otel: targets file %s not removed: %s", self.path, exc)


OWNER_HOST, OWNER_PID = "__rl_otel_host", "__rl_otel_pid"


def reap_dead(directory: Path, host: str, keep: Path | None = None) -> list[Path]:
    """Remove the ``rl_otel-*`` targets files in ``directory`` whose owner labels name ``host`` and a process that
    no longer runs (killed, so its ``close()`` never ran); the files removed. Never raises: a file that cannot be
    read or removed stays."""
    reaped: list[Path] = []
    try:
        candidates = sorted(directory.glob("rl_otel-*"))
    except OSError:
        return reaped
    for path in candidates:
        if path.suffix not in _SUFFIXES or path == keep:
            continue
        try:
            before = _identity(path)
            groups = json.loads(path.read_text()) if path.suffix == ".json" else _yaml_load(path.read_text())
            labels = groups[0]["labels"]
            if labels.get(OWNER_HOST) != host or _alive(int(labels[OWNER_PID])):
                continue
            if _identity(path) == before:  # not replaced meanwhile by a restarted rank of the same name
                path.unlink()
                reaped.append(path)
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
    return reaped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _yaml_load(text: str) -> list:
    import yaml

    return yaml.safe_load(text)


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _yaml(groups: list[dict]) -> str:
    import yaml

    return yaml.safe_dump(groups, sort_keys=False)
