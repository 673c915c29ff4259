"""Files: atomic writing and sha256 content hashes, one home each.

Writing: a crash never leaves a half-written output where a complete one is expected.  Every
writer of the project goes through :func:`atomic_path` (or :func:`atomic_dir` for a folder of
outputs): the content goes to a temporary file in the destination's folder (same file system, so
:func:`os.replace` is atomic), is flushed to disk, gets the permissions a plain ``open()`` would
have given it, and only then replaces the destination.  On any error the temporary file is removed
and a previous destination is left untouched.  :func:`atomic_write_bytes`, :func:`atomic_write_text`,
:func:`atomic_write_json`, :func:`atomic_write_parquet` and :func:`atomic_save_figure` are the
writers for the common formats.

Hashing: :func:`sha256_bytes`, :func:`sha256_text` (UTF-8) and :func:`sha256_file` (streamed;
:func:`sha256_file_cached` remembers a file version's hash for the process) return hex digests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from uamt.core.errors import DataError, UamtError


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _default_file_mode() -> int:
    # mkstemp creates 0600 files; outputs (reports, caches, models) get the umask-derived mode instead.
    return 0o666 & ~_umask()


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
    uamt.core.errors.DataError
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


def atomic_write_json(path: str | Path, data: Any, **dumps_options: Any) -> None:
    """Write ``json.dumps(data, **dumps_options) + "\\n"`` to ``path`` atomically (UTF-8).

    The options are the caller's (``indent``, ``sort_keys``, ``allow_nan``): each output keeps the
    exact formatting it always had.
    """
    atomic_write_text(path, json.dumps(data, **dumps_options) + "\n")


def atomic_write_parquet(path: str | Path, frame: Any, **to_parquet_options: Any) -> None:
    """``frame.to_parquet(path, **to_parquet_options)`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, **to_parquet_options)


def atomic_save_figure(fig: Any, path: str | Path, **savefig_options: Any) -> None:
    """``fig.savefig`` to ``path`` atomically; the format comes from ``path``'s suffix."""
    path = Path(path)
    # The temp name keeps the suffix: matplotlib picks the image format from it.
    with atomic_path(path, suffix=path.suffix) as tmp:
        fig.savefig(tmp, **savefig_options)


@contextmanager
def atomic_dir(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir``; on a clean exit it replaces ``out_dir``.

    On an error the temporary folder is removed and a previous ``out_dir`` is left untouched.  The
    temporary and the moved-aside folders are named ``.<name>.tmp-<pid>-*`` and ``.<name>.old-<pid>``,
    so leftovers of a killed process can be recognised (``uamt.models.api.recover_stale``).

    Raises
    ------
    uamt.core.errors.DataError
        If the parent folder of ``out_dir`` cannot be written.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{os.getpid()}-", dir=out_dir.parent))
    except OSError as exc:
        raise DataError(f"{out_dir}: cannot write in {out_dir.parent}: {exc}") from None
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; the folder gets a plain mkdir's mode
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text`` encoded as UTF-8."""
    return sha256_bytes(text.encode("utf-8"))


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read ``chunk`` bytes at a time (a 2 GB model never sits in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def sha256_file_cached(path: str | Path) -> str:
    """:func:`sha256_file`, computed once per process and file version (resolved path, size, mtime).

    Hashing XLM-R large (2 GB) takes seconds; cache keys and fingerprints ask for it often.
    """
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_HASHES:
        _FILE_HASHES[key] = sha256_file(path)
    return _FILE_HASHES[key]


_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32", "FF FE 00 00"),
    (b"\x00\x00\xfe\xff", "UTF-32", "00 00 FE FF"),
    (b"\xff\xfe", "UTF-16", "FF FE"),
    (b"\xfe\xff", "UTF-16", "FE FF"),
)


def read_meta_json(meta_path: Path, required, format_version: int, not_what: str) -> dict[str, Any]:
    """The JSON object of an export's meta file (ONNX encoder, ONNX network), checked.

    Raises
    ------
    UamtError
        Naming ``meta_path``: it is missing (``<folder> is not <not_what>``), not JSON, not an
        object, lacks a field of ``required``, or has another ``format_version``.
    """
    if not meta_path.is_file():
        raise UamtError(f"{meta_path}: missing; {meta_path.parent} is not {not_what}")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UamtError(f"{meta_path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UamtError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    missing = [key for key in required if key not in meta]
    if missing:
        raise UamtError(f"{meta_path}: missing field(s) {missing}")
    if meta["format_version"] != format_version:
        raise UamtError(f"{meta_path}: format_version {meta['format_version']!r}, this uamt reads {format_version}")
    return meta


def check_recorded_sha256(recorded: dict[Path, str], meta_path: Path, remedy: str) -> None:
    """UamtError naming the first file of ``recorded`` whose sha256 is not the one ``meta_path``
    recorded for it (``remedy`` ends the message)."""
    for path, expected in recorded.items():
        found = sha256_file_cached(path)
        if found != expected:
            raise UamtError(
                f"{path}: sha256 {found[:12]}… does not match {meta_path} "
                f"({str(expected)[:12]}…): the file is corrupt or was replaced{remedy}"
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


def read_stage_json(path: str | Path, stage: str) -> Any:
    """The JSON in ``path``, a stage's output; a missing or broken file is a DataError naming the
    ``stage`` that writes it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: missing; run `dvc repro {stage}` first")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); run `dvc repro {stage}` again") from exc
