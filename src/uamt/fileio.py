"""Writing files so that a crash never leaves a half-written output where a complete one is expected."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from uamt.errors import DataError


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder, fsync, then :func:`os.replace`.

    Raises
    ------
    uamt.errors.DataError
        If the folder cannot be written; nothing is left behind and a previous ``path`` is untouched.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise DataError(f"{path}: cannot write in {folder}: {exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
