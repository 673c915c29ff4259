"""WMT21 expert MQM per rater, with text, as republished by the WMT 2023 QE shared task (task 2).

``WMT-QE-Task/wmt-qe-2023-data`` ships Google's WMT21 MQM ratings of newstest2021 and of the TED
talks (``task_2/train/2021_<lp>_processed.tsv``, ``2021_TED_<lp>_processed.tsv``) for en-de, zh-en
and en-ru as one row per (system, segment, rater), with the text the raters saw.  The loaders of
:mod:`uamt.data.loaders` use it for what Google's own files lack: the text of ``metricsystem1-5``
and of rated references that wmt21-news-systems does not publish (en-de and zh-en ``ref-B``), the
newstest2021 document of each line, and all of en-ru (no Google scores, no newstest2021 en-ru
text in the data).  This module only reads and joins the files; it builds no table rows.

File layout (measured on the commit pinned in ``params.yaml``)
---------------------------------------------------------------
Nine tab-separated fields, :data:`QE_FIELDS`: ``mt_system`` (``hyp.X`` / ``ref.X`` in the news
files of en-de and zh-en, bare names elsewhere), ``doc_id``, ``seg_id`` (1-based position inside
the document, not a line number), ``annotator_id`` (``rater<k>``), ``source``, ``target``,
``start_ids`` / ``end_ids`` (character offsets of the error spans in ``target``, space-separated,
``-1`` = none) and ``errors`` (one severity per span: ``minor`` / ``major``, or ``no-error``).
There are **no error categories**, so a minor ``Fluency/Punctuation`` error weighs 1 here, not 0.1,
and a non-translation 5, not 25 (see :func:`uamt.data.mqm.mqm_weight`).

Three defects of the published files are handled here:

* Quoting.  The en-ru files start with a header line and were written with CSV quoting (a field
  holding ``"`` is wrapped in quotes with inner quotes doubled); the headerless en-de / zh-en
  files are raw (``"Yes," he said.`` appears as is).  A file is read as CSV-quoted iff it has the
  header.
* Document names with a space (``seattle times.253485``, ``jingji guancha bao-zh-01.10329``) were
  split over the following columns, losing ``annotator_id`` (two-word names) or ``seg_id`` and
  ``annotator_id`` (three-word names) while the row keeps nine fields.  Such rows are repaired: the
  name is re-joined with ``_`` (the WMT21 convention: no published WMT21 document id has a space,
  multi-word outlets are written ``shizuoka_shimbun-ja``), the rater is unknown (None) and the
  position in the document is taken from the source-text join where it is lost.
* Text normalisation.  The ``source`` / ``target`` texts are a lightly normalised copy of the
  newstest2021 text: curly quotes made straight, ``U.S.`` written ``US``, thousands separators
  and some spaces removed.  Sources are therefore joined to the newstest2021 lines by
  :func:`match_key` (exact text first).

Rows with another number of fields than nine are dropped, counted and logged; above
:data:`MAX_BAD_FIELD_SHARE` of the file the layout is not this one and :class:`DataError` is raised.
"""

from __future__ import annotations

import csv
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from uamt.core.errors import DataError
from uamt.data.mqm import mqm_weight
from uamt.data.schema import check_text, read_lines

log = logging.getLogger(__name__)

QE_REPO = "WMT-QE-Task/wmt-qe-2023-data"
#: Folder of the WMT21 MQM files inside the repository.
QE_DIR = Path("task_2") / "train"
#: Column names, as in the header line of the en-ru files (the other files have no header).
QE_FIELDS = (
    "mt_system",
    "doc_id",
    "seg_id",
    "annotator_id",
    "source",
    "target",
    "start_ids",
    "end_ids",
    "errors",
)
#: Share of data lines with the wrong number of fields above which the file is refused (a file in
#: another layout, e.g. comma-separated, would otherwise be silently dropped line by line).
MAX_BAD_FIELD_SHARE = 0.05
#: Placeholder the files write for an empty system output (zh-en Online-W and metricsystem5 each
#: have one; wmt21-news-systems has an empty line there).
EMPTY_TARGET = "EMPTY"
#: Floor of one rater's MQM score.  Google's WMT21 protocol lets a rater mark at most five errors
#: (-25 = five majors = one non-translation), so every published WMT21 score lies in [-25, 0]; the
#: en-ru rater of these files sometimes marked more (up to 19).  Capping keeps en-ru on the scale
#: of the Google-scored language pairs (and inside ``schema.MQM_RANGE``).
MQM_FLOOR = -25.0

_INT = re.compile(r"-?\d+")
_POSITIVE = re.compile(r"[1-9]\d*")
_RATER = re.compile(r"rater\d+")
_CURLY_SINGLE = re.compile(r"[\u2018\u2019\u201a\u201b]")
_CURLY_DOUBLE = re.compile(r"[\u201c\u201d\u201e]")
_KEY_DROP = re.compile(r"[\s.,\u200b\u200c\u200d\ufeff]")
#: System names of the files -> Google's names (``hyp.X`` -> ``X``; ``ref.X`` -> ``ref-X``; the
#: TED files' ``ref`` / ``refB`` as in Google's TED files).
_TED_REFS = {"ref": "ref-A", "refB": "ref-B"}


def qe_path(root: str | Path, lp: str, *, ted: bool = False) -> Path:
    """Path of the WMT21 news (``ted=False``) or TED MQM file of ``lp`` under the data ``root``."""
    name = f"2021_TED_{lp}_processed.tsv" if ted else f"2021_{lp}_processed.tsv"
    return Path(root) / QE_REPO / QE_DIR / name


def system_name(raw: str) -> str:
    """Google's name of a system of these files: ``hyp.X`` -> ``X``, ``ref.X`` -> ``ref-X``."""
    if raw.startswith("hyp."):
        return raw[4:]
    if raw.startswith("ref.") and len(raw) > 4:
        return f"ref-{raw[4:]}"
    return _TED_REFS.get(raw, raw)


def match_key(text: str) -> str:
    """Key under which a QE-file text and a newstest2021 line count as the same segment.

    Undoes what the QE files changed (see the module docstring): curly quotes -> straight, then
    whitespace, zero-width spaces, ``.`` and ``,`` removed.  Only used after an exact match failed.
    """
    text = _CURLY_DOUBLE.sub('"', _CURLY_SINGLE.sub("'", text))
    return _KEY_DROP.sub("", text)


@dataclass(frozen=True)
class QeJudgement:
    """One rater's MQM judgement of one (system, segment), as read from a QE file.

    ``line`` is the 1-based line of the file; ``system`` Google's name (:func:`system_name`);
    ``seg_in_doc`` the 1-based position in the document (None where a split document name lost
    it); ``rater`` None where it was lost; ``severities`` the ``errors`` tokens in file order.
    ``penalty`` = ``-sum(mqm_weight(severity))`` over the errors (0 best, negative worse, not
    capped: see :data:`MQM_FLOOR`).
    """

    line: int
    system: str
    doc: str
    seg_in_doc: int | None
    rater: str | None
    source: str
    target: str
    severities: tuple[str, ...]
    penalty: float

    @property
    def score(self) -> float:
        """The rater's MQM score on the WMT21 scale: ``penalty`` floored at :data:`MQM_FLOOR`."""
        return max(self.penalty, MQM_FLOOR)

    @property
    def empty_target(self) -> bool:
        """True where the file writes :data:`EMPTY_TARGET` for an empty system output."""
        return self.target == EMPTY_TARGET


@dataclass
class QeFile:
    """The judgements of one QE file and what reading it found.

    ``bad_field_lines``: file lines with another number of fields than nine (dropped);
    ``repaired``: judgements whose split document name was re-joined (module docstring).
    """

    path: Path
    judgements: list[QeJudgement]
    bad_field_lines: list[int] = field(default_factory=list)
    repaired: int = 0

    @property
    def name(self) -> str:
        return str(self.path)


def _split(text_line: str, quoted: bool, name: str, line: int) -> list[str]:
    if not quoted:
        return text_line.split("\t")
    try:
        return next(csv.reader([text_line], delimiter="\t", quotechar='"', doublequote=True, strict=True))
    except csv.Error as exc:
        raise DataError(f"{name}: line {line}: bad CSV quoting: {exc}") from exc


def _spans(fields: list[str], name: str, line: int) -> tuple[str, ...]:
    """The severities of a row, checked against its span offsets (one start and end per error)."""
    starts, ends, errors = (fields[i].split(" ") for i in (6, 7, 8))
    for column, values in (("start_ids", starts), ("end_ids", ends)):
        if not all(_INT.fullmatch(v) for v in values):
            raise DataError(
                f"{name}: line {line}: column {column!r} must hold space-separated integers, got "
                f"{fields[QE_FIELDS.index(column)]!r}"
            )
    if not (len(starts) == len(ends) == len(errors)):
        raise DataError(
            f"{name}: line {line}: {len(errors)} error severities {fields[8]!r} but {len(starts)} "
            f"start and {len(ends)} end offsets; the columns are misaligned"
        )
    return tuple(errors)


def _locate(fields: list[str], name: str, line: int) -> tuple[str, int | None, str | None, bool]:
    """(document, position in it, rater, repaired) of a row, re-joining a split document name."""
    doc, seg, rater = fields[1], fields[2], fields[3]
    if _POSITIVE.fullmatch(seg) and rater and not _INT.fullmatch(rater):
        return doc, int(seg), rater, False
    if not _INT.fullmatch(seg) and _POSITIVE.fullmatch(rater):
        # two-word document name: "<w1>\t<w2>\t<seg_id>", the rater column lost
        return f"{doc}_{seg}", int(rater), None, True
    if not _INT.fullmatch(seg) and not _INT.fullmatch(rater) and not _RATER.fullmatch(rater):
        # three-word document name: "<w1>\t<w2>\t<w3>", seg_id and rater lost
        return f"{doc}_{seg}_{rater}", None, None, True
    raise DataError(
        f"{name}: line {line}: seg_id {seg!r} / annotator_id {rater!r}: expected a positive integer "
        "and a rater name"
    )


def read_qe_file(path: str | Path) -> QeFile:
    """Read one WMT21 MQM file of the QE-2023 data (layout and repairs: module docstring).

    Raises
    ------
    DataError
        Naming the file and line: non-UTF-8 bytes, a renamed header column, bad CSV quoting, a
        non-integer ``seg_id``, misaligned span / severity columns, an unknown severity, empty
        source or target text, or more than :data:`MAX_BAD_FIELD_SHARE` of lines with the wrong
        number of fields.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: WMT21 MQM file of the QE-2023 data not found (run `uamt data fetch`)")
    name = str(path)
    lines = read_lines(path)
    quoted = bool(lines) and lines[0].split("\t")[0] == QE_FIELDS[0]
    if quoted and lines[0].split("\t") != list(QE_FIELDS):
        raise DataError(
            f"{name}: line 1: header {lines[0].split(chr(9))} differs from the expected {list(QE_FIELDS)} "
            "(was a column renamed?)"
        )
    out = QeFile(path, [])
    first = 2 if quoted else 1
    n_lines = 0
    for number, text_line in enumerate(lines[first - 1 :], start=first):
        if not text_line.strip():
            continue
        n_lines += 1
        fields = _split(text_line, quoted, name, number)
        if len(fields) != len(QE_FIELDS):
            out.bad_field_lines.append(number)
            continue
        doc, seg, rater, repaired = _locate(fields, name, number)
        out.repaired += repaired
        severities = _spans(fields, name, number)
        try:
            penalty = -sum(mqm_weight(severity) for severity in severities)
        except DataError as exc:
            raise DataError(f"{name}: line {number}: column 'errors': {exc}") from exc
        out.judgements.append(
            QeJudgement(
                line=number,
                system=system_name(check_text(fields[0], name, number, "mt_system")),
                doc=check_text(doc, name, number, "doc_id"),
                seg_in_doc=seg,
                rater=rater,
                source=check_text(fields[4], name, number, "source"),
                target=check_text(fields[5], name, number, "target"),
                severities=severities,
                penalty=float(penalty),
            )
        )
    bad = len(out.bad_field_lines)
    if not out.judgements or bad > MAX_BAD_FIELD_SHARE * n_lines:
        first_bad = f" (first: line {out.bad_field_lines[0]})" if bad else ""
        raise DataError(
            f"{name}: {bad} of {n_lines} lines do not have the {len(QE_FIELDS)} tab-separated fields "
            f"{list(QE_FIELDS)}{first_bad}; not the WMT21 MQM layout of the QE-2023 data"
        )
    if bad:
        log.info(
            "%s: dropped %d lines without %d fields (first: line %d)",
            name,
            bad,
            len(QE_FIELDS),
            out.bad_field_lines[0],
        )
    if out.repaired:
        log.info(
            "%s: %d rows had a document name with a space split over seg_id/annotator_id: "
            "re-joined, rater unknown",
            name,
            out.repaired,
        )
    return out


@dataclass
class QeJoin:
    """QE judgements placed on the lines of a newstest2021 source file.

    ``line_of``: per judgement (same order as ``QeFile.judgements``), its 1-based source line,
    or None where its source is in no line (dropped by the loaders).  ``doc_of_line``: the
    document of every matched line.  ``exact``: judgements whose source equals the line verbatim
    (the rest matched under :func:`match_key`).
    """

    line_of: list[int | None]
    doc_of_line: dict[int, str]
    exact: int

    @property
    def matched(self) -> int:
        return sum(line is not None for line in self.line_of)


def join_source(qe: QeFile, source: list[str], source_file: str | Path) -> QeJoin:
    """Find each judgement's line in ``source`` (the lines of ``source_file``).

    A judgement matches the line whose text equals its source, else the line with the same
    :func:`match_key`.  Where several lines qualify, the one at the judgement's position in its
    document (document start = line - position + 1, from its other judgements) is taken, else the
    judgement stays unmatched.  Checks that the join is a consistent placement of whole documents:

    Raises
    ------
    DataError
        Naming the QE file and line: one document placed at two start lines (its segments are not
        contiguous in ``source_file``), a line claimed by two documents, or one (document,
        position) matched to two lines.
    """
    exact_lines: dict[str, list[int]] = defaultdict(list)
    key_lines: dict[str, list[int]] = defaultdict(list)
    for i, text in enumerate(source, start=1):
        exact_lines[text].append(i)
        key_lines[match_key(text)].append(i)

    def candidates(j: QeJudgement) -> tuple[list[int], bool]:
        found = exact_lines.get(j.source)
        if found:
            return found, True
        return key_lines.get(match_key(j.source), []), False

    # First the unambiguous matches fix each document's start line, then the ambiguous ones use it.
    line_of: list[int | None] = [None] * len(qe.judgements)
    exact = 0
    start_of: dict[str, tuple[int, int]] = {}  # doc -> (start line, QE line that set it)
    pending: list[int] = []
    for k, j in enumerate(qe.judgements):
        found, is_exact = candidates(j)
        if len(found) == 1:
            line_of[k] = found[0]
            exact += is_exact
            if j.seg_in_doc is not None:
                start = found[0] - j.seg_in_doc + 1
                if j.doc in start_of and start_of[j.doc][0] != start:
                    raise DataError(
                        f"{qe.name}: line {j.line}: document {j.doc!r} position {j.seg_in_doc} matches line "
                        f"{found[0]} of {source_file}, so the document starts at line {start}, but line "
                        f"{start_of[j.doc][1]} of {qe.name} puts its start at line {start_of[j.doc][0]}"
                    )
                start_of[j.doc] = (start, j.line)
        elif found:
            pending.append(k)
    for k in pending:
        j = qe.judgements[k]
        found, is_exact = candidates(j)
        if j.doc in start_of and j.seg_in_doc is not None:
            line = start_of[j.doc][0] + j.seg_in_doc - 1
            if line in found:
                line_of[k] = line
                exact += is_exact
    doc_of_line: dict[int, str] = {}
    claimed: dict[int, int] = {}
    line_of_position: dict[tuple[str, int], tuple[int, int]] = {}
    for j, line in zip(qe.judgements, line_of, strict=True):
        if line is None:
            continue
        if doc_of_line.setdefault(line, j.doc) != j.doc:
            raise DataError(
                f"{qe.name}: line {j.line}: line {line} of {source_file} is in document {j.doc!r} here but "
                f"in {doc_of_line[line]!r} on line {claimed[line]}"
            )
        claimed.setdefault(line, j.line)
        if j.seg_in_doc is not None:
            before = line_of_position.setdefault((j.doc, j.seg_in_doc), (line, j.line))
            if before[0] != line:
                raise DataError(
                    f"{qe.name}: line {j.line}: document {j.doc!r} position {j.seg_in_doc} matches line {line} "
                    f"of {source_file} but line {before[0]} on line {before[1]}"
                )
    return QeJoin(line_of=line_of, doc_of_line=doc_of_line, exact=exact)


def number_segments(qe: QeFile) -> list[int | None]:
    """Per judgement, a 1-based segment number where no source file gives line numbers (TED en-ru).

    Segments are the (document, position) pairs numbered in order of first appearance in the file
    (the TED en-ru file lists talk 1 segment 1, 2, ... first, so this is talk order then position).
    None where the position was lost (a split document name).

    Raises
    ------
    DataError
        Naming the file and line, when one (document, position) has two different source texts.
    """
    number: dict[tuple[str, int], int] = {}
    source_of: dict[tuple[str, int], tuple[str, int]] = {}
    out: list[int | None] = []
    for j in qe.judgements:
        if j.seg_in_doc is None:
            out.append(None)
            continue
        key = (j.doc, j.seg_in_doc)
        seen = source_of.setdefault(key, (j.source, j.line))
        if seen[0] != j.source:
            raise DataError(
                f"{qe.name}: line {j.line}: document {j.doc!r} position {j.seg_in_doc} has another source "
                f"text than on line {seen[1]}"
            )
        out.append(number.setdefault(key, len(number) + 1))
    return out


def group_judgements(qe: QeFile, segment_of: list[int | None]) -> dict[tuple[str, int], list[QeJudgement]]:
    """(system, segment) -> its judgements, one per rater, in file order; unplaced ones left out.

    Raises
    ------
    DataError
        Naming the file and line, when a rater judges the same (system, segment) twice or the
        raters of one (system, segment) saw different target texts.
    """
    groups: dict[tuple[str, int], list[QeJudgement]] = defaultdict(list)
    for j, seg in zip(qe.judgements, segment_of, strict=True):
        if seg is None:
            continue
        group = groups[(j.system, seg)]
        for other in group:
            if j.rater is not None and other.rater == j.rater:
                raise DataError(
                    f"{qe.name}: line {j.line}: rater {j.rater} judges system {j.system} segment {seg} "
                    f"again (first on line {other.line})"
                )
            if other.target != j.target:
                raise DataError(
                    f"{qe.name}: line {j.line}: system {j.system} segment {seg} has another target text "
                    f"than on line {other.line}"
                )
        group.append(j)
    return dict(groups)
