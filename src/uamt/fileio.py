"""Writing files so that a crash never leaves a half-written output where a complete one is expected.

Every writer of the project goes through :func:`atomic_path`: the content goes to a temporary file
in the destination's folder (same file system, so :func:`os.replace` is atomic), is flushed to disk,
gets the permissions a plain ``open()`` would have given it, and only then replaces the destination.
On any error the temporary file is removed and a previous destination is left untouched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from uamt.errors import DataError


def _default_file_mode() -> int:
    # mkstemp creates 0600 files; outputs (reports, caches, models) get the umask-derived mode instead.
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it replaces ``path``, on an error it is removed.

    For writers that want a file name (``torch.save``, ``DataFrame.to_parquet``, a download): the body
    may also raise after writing (a failed checksum, say) and nothing reaches ``path``.

    Raises
    ------
    uamt.errors.DataError
        If the folder of ``path`` cannot be written.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=folder)
    except OSError as exc:
        raise DataError(f"{path}: cannot write in {folder}: {exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _default_file_mode())
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` atomically (see :func:`atomic_path`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32", "FF FE 00 00"),
    (b"\x00\x00\xfe\xff", "UTF-32", "00 00 FE FF"),
    (b"\xff\xfe", "UTF-16", "FF FE"),
    (b"\xfe\xff", "UTF-16", "FE FF"),
)


def wide_encoding_hint(data: bytes) -> str | None:
    """If ``data`` is UTF-16/32 text (a byte-order mark, or NUL bytes between ASCII), say so and how to convert.

    Readers call it before decoding UTF-8, so such a file is named for what it is instead of
    failing on its first byte with a hint to convert from latin1.
    """
    for bom, name, shown in _WIDE_BOMS:
        if data.startswith(bom):
            return (
                f"encoded as {name} (byte-order mark {shown}), not UTF-8; "
                f"convert it, e.g. iconv -f {name} -t UTF-8 FILE > FILE.utf8"
            )
    head = data[:4096]
    if len(head) >= 8 and head.count(0) * 3 >= len(head):  # 'a\x00b\x00...': UTF-16 without a BOM
        return (
            "looks like UTF-16 without a byte-order mark (every other byte is NUL), not UTF-8; "
            "convert it, e.g. iconv -f UTF-16LE -t UTF-8 FILE > FILE.utf8"
        )
    return None
