"""Publish the endpoint in a Prometheus ``file_sd_configs`` targets file, so ranks on ephemeral ports are found.

Each process writes its own file, ``<dir>/rl_otel-<run>-<role>-rank<rank>-<id>.json``: run and role readable (other
than ASCII letters, digits, ``_.-`` replaced by ``_``), ``<id>`` a short hash of the exact run, role, rank, host
name and the target itself (host:port), so two processes never write one file - not Trinity's explorer and trainer
(one run, both rank 0), not two runs whose names read alike (``实验`` and ``测试``), not two ranks of one host.
Prometheus reads them all with ``files: [<dir>/*.json]``. A file is replaced atomically
(:mod:`rl_otel._internal.atomic`): Prometheus watches the directory and must never read half a file. ``close()``
removes it, so a finished run's targets disappear instead of turning ``up == 0``. The target group's labels ``run``
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

    def __init__(self, path: Path, target: str, labels: dict[str, str]) -> None:
        """Raises :class:`ConfigurationError` naming the file when it cannot be written (read-only directory, no
        permission, a file where a directory should be): ``init()`` fails with a configuration error, not a bare
        ``OSError``."""
        self.path = path
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


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _yaml(groups: list[dict]) -> str:
    import yaml

    return yaml.safe_dump(groups, sort_keys=False)
