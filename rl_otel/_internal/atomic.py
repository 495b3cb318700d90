"""Replace a file atomically: whoever reads it (Prometheus' file_sd, a restarted watcher, promtool) finds the old
content or the new, never half of either, even when the writer is killed mid-write (SIGKILL included).

The text goes to a temporary file in the target's directory (``os.replace`` is atomic only within one file
system), is flushed and fsynced (so a crash right after the rename does not leave an empty file under the name),
then renamed over the target. On any failure the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int | None = None,
                 encoding: str = "utf-8") -> Iterator[TextIO]:
    """A text file to write; when the block ends without an exception it replaces ``path`` (see the module).

    ``mode``: the file's permission bits (``0o644`` for a file another user's process reads); ``None`` keeps the
    temporary file's, readable and writable by its owner only. Raises what writing or renaming raised, after
    removing the temporary file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        # boundary: the OS and the caller's body (any error, even KeyboardInterrupt): no temp file left, re-raised
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
