"""Line-aligned text input and all-or-nothing output for ``uamt score`` / ``uamt compare``.

Inputs are plain text files with one segment per line (``\\n`` or ``\\r\\n``), UTF-8 (a leading
BOM is dropped).  Only ``\\n`` separates segments: Unicode line separators inside a segment
(U+2028, U+0085, ...) stay part of it, so files never shift out of alignment.

Outputs are written to a temp file in the destination folder and moved into place with
:func:`os.replace`, so a failure leaves no file (or the previous one, byte-identical).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from uamt.core.errors import DataError
from uamt.core.fileio import (
    atomic_write_text,  # noqa: F401 - re-exported for scoring
    wide_encoding_hint,
)
from uamt.core.textcheck import blank_detail, is_blank

#: Output suffix -> format for segment-level results.
SEGMENT_FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"}

_BOM = b"\xef\xbb\xbf"

#: Longest segment ``read_lines`` accepts, in characters (``--max-segment-chars``).  Encoders read
#: at most a few hundred tokens (~2,000 characters; longer segments are scored on their beginning
#: only, with a warning naming them), so a "segment" far longer is almost always a file whose line
#: breaks were lost (a document on one line).  Refused with the line named rather than scored.
MAX_SEGMENT_CHARS = 100_000

#: Largest input file ``read_lines`` reads, in bytes (``--max-file-bytes``): 100 MiB is ~500,000
#: segments, days of CPU scoring.  Reading stops there (a device such as /dev/zero, a wrong file).
MAX_FILE_BYTES = 100 * 1024 * 1024

_CHUNK = 1 << 20


def _read_limited(path: Path, max_file_bytes: int, max_segment_chars: int) -> bytes:
    """The bytes of ``path``, read in chunks and refused as soon as the file or one line is too long.

    A line longer than ``4 * max_segment_chars`` bytes (UTF-8 has at most 4 bytes per character)
    is over the character limit whatever it holds, so an endless input without line breaks
    (``/dev/zero``) is refused after a few hundred kilobytes, not at the memory limit.
    """
    max_line_bytes = 4 * max_segment_chars + len(_BOM) + 1  # + a BOM on line 1, + the CR of a CRLF
    parts: list[bytes] = []
    total = 0
    line = 1  # number of the line the next byte belongs to
    line_bytes = 0  # bytes of that line read so far
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                total += len(chunk)
                if total > max_file_bytes:
                    raise DataError(
                        f"{path}: file is over the limit of {max_file_bytes} bytes (--max-file-bytes); "
                        "split it, or raise the limit if it really is one set of segments"
                    )
                pieces = chunk.split(b"\n")
                for k, piece in enumerate(pieces):
                    size = line_bytes + len(piece) if k == 0 else len(piece)
                    if size > max_line_bytes:
                        raise DataError(
                            f"{path}:{line + k}: segment of more than {max_line_bytes} bytes without a "
                            f"line break is over the limit of {max_segment_chars} characters "
                            "(--max-segment-chars); are the line breaks missing (one segment per line)?"
                        )
                line += len(pieces) - 1
                line_bytes = line_bytes + len(pieces[0]) if len(pieces) == 1 else len(pieces[-1])
                parts.append(chunk)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, expected a text file with one segment per line") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    return b"".join(parts)


def read_lines(
    path: str | Path,
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_segment_chars: int = MAX_SEGMENT_CHARS,
) -> list[str]:
    """Read ``path`` as UTF-8, one segment per line.

    Returns
    -------
    list of str
        The lines without their ``\\n`` / ``\\r\\n`` terminators (a final newline is optional).

    Raises
    ------
    uamt.core.errors.DataError
        The file is missing or unreadable, over ``max_file_bytes``, is not valid UTF-8 (message
        names the line and byte offset), is empty, has an empty line (whitespace or invisible
        characters only: NUL, U+FEFF, U+200B, U+2060, ...; see :mod:`uamt.core.textcheck`), a carriage
        return inside a line (CR-only line ends would merge segments), or a line longer than
        ``max_segment_chars`` (message names the line).
    """
    path = Path(path)
    data = _read_limited(path, max_file_bytes, max_segment_chars)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    hint = wide_encoding_hint(data)
    if hint:
        raise DataError(f"{path}: {hint}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte {exc.start - line_start + 1} of the line); "
            "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    if not text:
        raise DataError(f"{path}: file is empty")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline terminates the last line; it does not start a new one
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    for number, line in enumerate(lines, start=1):
        if "\r" in line:
            raise DataError(
                f"{path}:{number}: carriage return (\\r) inside the line ({line.count(chr(13))} of them): the "
                "file has CR-only (classic Mac) line ends or stray CRs, which would merge segments; "
                "convert the line ends to \\n (e.g. tr '\\r' '\\n') or remove the CRs"
            )
        if is_blank(line):
            detail = blank_detail(line)
            detail = f"{detail}; " if detail else ""
            raise DataError(f"{path}:{number}: empty line ({detail}every line must hold one segment)")
        if len(line) > max_segment_chars:
            raise DataError(
                f"{path}:{number}: segment of {len(line)} characters is over the limit of "
                f"{max_segment_chars} characters (--max-segment-chars); are the line breaks missing "
                "(one segment per line)?"
            )
    return lines


def read_aligned(
    files: dict[str, Sequence[str | Path]],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_segment_chars: int = MAX_SEGMENT_CHARS,
) -> dict[str, list[list[str]]]:
    """Read every file of ``files`` (role -> paths) and check they all have the same number of lines.

    Returns
    -------
    dict
        role -> one list of lines per path, in the given order.

    Raises
    ------
    uamt.core.errors.DataError
        From :func:`read_lines`, or when line counts differ (the message lists every file with
        its count).
    """
    read: dict[str, list[list[str]]] = {}
    counts: list[tuple[str, str, int]] = []
    for role, paths in files.items():
        read[role] = []
        for path in paths:
            lines = read_lines(path, max_file_bytes=max_file_bytes, max_segment_chars=max_segment_chars)
            read[role].append(lines)
            counts.append((role, str(path), len(lines)))
    if len({count for _, _, count in counts}) > 1:
        listing = ", ".join(f"{path} ({role}): {count}" for role, path, count in counts)
        raise DataError(f"input files have different line counts; they must be line-aligned: {listing}")
    return read


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name the same file: the same path once symlinks and ``..`` are
    resolved, or the same inode (a hard link, a symlink to it)."""
    try:
        if os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b):
            return True
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):  # a symlink loop, a path we may not stat
        return False


def check_output_path(
    path: str | Path, formats: dict[str, str] = SEGMENT_FORMATS, inputs: Sequence[str | Path] = ()
) -> str:
    """Check, before any work is done, that ``path`` can be written; return its format.

    Raises
    ------
    uamt.core.errors.DataError
        Unknown suffix, missing folder, a folder in the way, a folder we cannot write to, or
        ``path`` is one of ``inputs`` (same resolved path, a symlink to it, or a hard link).
    """
    path = Path(path)
    fmt = formats.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: unsupported output suffix {path.suffix!r}; choose from {sorted(formats)}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise DataError(f"{path}: output folder {folder} does not exist")
    if path.is_dir():
        raise DataError(f"{path}: is a folder, expected an output file path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(f"{path}: output folder {folder} is not writable")
    for source in inputs:
        if same_file(path, source):
            raise DataError(
                f"{path}: is the input file {source} (the same file once links are followed); "
                "--out must not overwrite an input: choose another output path"
            )
    return fmt


def json_safe(value: Any) -> Any:
    """Numpy scalars -> Python numbers, NaN/inf -> None (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def jsonl_text(records: Iterable[dict[str, Any]]) -> str:
    """One strict-JSON object per line (non-ASCII kept as is)."""
    return "".join(json.dumps(json_safe(r), ensure_ascii=False, allow_nan=False) + "\n" for r in records)


def delimited_text(records: Sequence[dict[str, Any]], sep: str) -> str:
    """CSV (``sep=","``) or TSV (``sep="\\t"``) with a header row; missing values are empty."""
    import pandas as pd

    frame = pd.DataFrame.from_records([json_safe(r) for r in records])
    return frame.to_csv(sep=sep, index=False, lineterminator="\n", float_format="%.6g")


def render_segments(fmt: str, records: Sequence[dict[str, Any]], summary: dict[str, Any] | None) -> str:
    """Text of the segment-level output: JSONL (segments, then ``{"summary": ...}``), CSV or TSV."""
    if fmt == "jsonl":
        tail = [{"summary": summary}] if summary is not None else []
        return jsonl_text([*records, *tail])
    if fmt == "csv":
        return delimited_text(records, ",")
    if fmt == "tsv":
        return delimited_text(records, "\t")
    raise DataError(
        f"output format {fmt!r} not supported; choose from {sorted(set(SEGMENT_FORMATS.values()))}"
    )
