"""One loader per public source, each returning the canonical table of :mod:`uamt.data.schema`.

Every loader takes ``root``: a folder laid out as ``<owner>/<repo>/<path>`` (``data/raw`` after
``uamt data fetch``, or the offline mirror itself).  Bad input raises :class:`DataError` naming
the file and the line: missing/renamed columns, NaN/inf/non-numeric scores, empty or
whitespace-only text, text files shorter than the scores' segment ids, unknown systems and
non-UTF-8 bytes.  Rows dropped on purpose (unrated, no text, listed in ``drop_systems``) are
counted in the log at INFO level.

Documents (``doc``) are namespaced ``<testset>/<source language>/<doc id>`` so the same
newstest2021 document has the same key in WMT21 DA and WMT21 MQM; where no document ids are
published, contiguous blocks of ``pseudo_doc_size`` segments form pseudo-documents
(``.../pseudo-0003``).
"""

from __future__ import annotations

import ast
import csv
import fnmatch
import io
import logging
import re
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.data.schema import (
    DA_Z_RANGE,
    HTER_RANGE,
    MQM_RANGE,
    RAW_DA_RANGE,
    check_range,
    check_text,
    check_unique_keys,
    decode_lines,
    decode_text,
    finish_table,
    numeric_column,
    read_lines,
    require_columns,
    sample_std,
)
from uamt.data.sources import wmt21_qe

log = logging.getLogger(__name__)

WMT_REPO = "wmt-conference/wmt21-news-systems"
MQM_REPO = "google/wmt-mqm-human-evaluation"
MLQE_REPO = "facebookresearch/mlqe"
HTER_REPO = "deep-spin/UA_COMET"

WMT21_DA_LPS = ("cs-en", "de-en", "ha-en", "is-en", "ja-en", "ru-en", "zh-en")
WMT21_MQM_LPS = ("en-de", "zh-en", "en-ru")
TED_MQM_LPS = ("en-de", "zh-en", "en-ru")
#: WMT21 news MQM language pairs without Google scores or newstest2021 text in the data, read from
#: the QE-2023 file alone -> the language pair whose source file numbers their lines.  The en-X
#: test sets of WMT21 share one English source: all 527 rated en-ru sources are lines of the en-de
#: source file, at the same document and position as in the en-de QE file.
SHARED_SOURCE_LP = {"en-ru": "en-de"}
#: TED MQM language pairs read from the QE-2023 file alone (no Google TED file).
QE_ONLY_TED_LPS = ("en-ru",)
#: Least share of QE targets of published systems/references that must equal their
#: wmt21-news-systems text (under ``wmt21_qe.match_key``); lower means the QE rows were placed on
#: the wrong lines.  Measured: 100 % for en-de and zh-en.
QE_TEXT_AGREEMENT = 0.95
MLQE_LPS = ("en-de", "en-zh", "et-en", "ne-en", "ro-en", "si-en")
QT21_FILES = (
    ("nmt", "en-de"),
    ("nmt", "en-lv"),
    ("smt", "de-en"),
    ("smt", "en-cs"),
    ("smt", "en-de"),
    ("smt", "en-lv"),
)

#: Score-file system names whose text file has another name.
SYSTEM_ALIASES = {"Nemo": "NVIDIA-NeMo"}
#: The judgement types in ``ad-*-good-stnd.csv`` whose mean is ``Z.SCR``: the ordinary item and
#: its repeat (REF and BAD_REF are quality-control items, not judgements of the system output).
DA_JUDGEMENT_TYPES = ("SYSTEM", "REPEAT")
#: Why a WMT21 DA language pair without published document ids cannot be joined to its text.
NO_DOC_ORDER = (
    "no public document ids: DA segment ids count segments in document-id order, which cannot be "
    "rebuilt without them (left out rather than joined to the wrong sentences)"
)
#: Which reference file WMT21 to-English ``HUMAN`` is.  Not stated in the files; HUMAN's
#: mean standardised score (about -0.07 in cs-en/de-en, 0.08 in ru-en) is that of an ordinary
#: system, not that of the REF quality-control items (0.7-0.9) in which annotators compare
#: reference A with itself, so HUMAN is the second reference, B (as in the WMT21 findings).
DEFAULT_HUMAN_REFERENCE = {"cs-en": "B", "de-en": "B", "ru-en": "B", "zh-en": "B"}
#: Systems every run skips, per dataset (none: ``metricsystem1-5`` of WMT21 MQM, once dropped for
#: want of text, take theirs from the QE-2023 file).
DEFAULT_DROP_SYSTEMS: dict[str, dict[str, str]] = {"wmt21_mqm": {}}
TED_REF_SYSTEMS = {"ref": "ref-A", "refB": "ref-B"}
_REF_SYSTEM = re.compile(r"^ref-([A-Z])$")
_SPAN_MARK = re.compile(r"</?v>")
QT21_DOMAIN = {"en-de": "it"}  # QT21: en-de is IT; en-cs, en-lv, de-en are life sciences


# ----------------------------------------------------------------------------- helpers


def _lp_parts(lp: str) -> tuple[str, str]:
    src, tgt = lp.split("-")
    return src, tgt


def _check_lps(lps: Iterable[str], known: Iterable[str], dataset: str) -> list[str]:
    """The requested language pairs, refusing any the dataset does not publish."""
    lps, known = list(lps), list(known)
    for lp in lps:
        if lp not in known:
            raise DataError(f"{dataset}: lp={lp!r} not supported; choose from {sorted(known)}")
    return lps


def _read_table(path: Path, *, sep: str, name: str | None = None, data: bytes | None = None) -> pd.DataFrame:
    """Read a delimited file as strings (UTF-8 checked, no NA conversion, no quoting for TSV)."""
    name = name or str(path)
    raw = data if data is not None else Path(path).read_bytes()
    text = decode_text(raw, name)
    kwargs = {"quoting": csv.QUOTE_NONE} if sep == "\t" else {}
    try:
        return pd.read_csv(
            io.StringIO(text), sep=sep, dtype=str, keep_default_na=False, index_col=False, **kwargs
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise DataError(f"{name}: cannot parse as a table: {exc}") from exc


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: {what} not found (run `uamt data fetch`, or check the data root)")
    return path


def _dropped_reason(system: str, patterns: Mapping[str, str]) -> str | None:
    for pattern, reason in patterns.items():
        if fnmatch.fnmatchcase(system, pattern):
            return reason
    return None


def _count_drop(drops: dict[str, int], key: str) -> None:
    """One more row dropped for ``key`` (the reason logged by :func:`_log_drops`)."""
    drops[key] = drops.get(key, 0) + 1


def _system_dropped(system: str, patterns: Mapping[str, str], drops: dict[str, int]) -> bool:
    """Whether ``system`` matches a ``prepare.drop_systems`` pattern; its row is then counted in ``drops``."""
    reason = _dropped_reason(system, patterns)
    if reason is not None:
        _count_drop(drops, f"system {system} ({reason})")
    return reason is not None


def _seg_line(
    lines: list[str], sid: int, text_file: Path, score_file: str, score_line: int, what: str
) -> str:
    if sid < 1 or sid > len(lines):
        raise DataError(
            f"{score_file}: line {score_line}: segment id {sid} is beyond the {len(lines)} lines of "
            f"{what} file {text_file}"
        )
    return check_text(lines[sid - 1], str(text_file), sid, what)


EMPTY_MT = "empty system output line (drop_empty_mt)"


def _system_output(
    text, file_system, shown_name, sid, name, line, dataset, drop_empty_mt, drops
) -> str | None:
    """Segment ``sid`` of a WMT21 system output; None (counted in ``drops``) when it is empty and
    ``drop_empty_mt``; a DataError naming the score file and line when the system has no text file."""
    hyp_file = text.hyp_file(file_system)
    if not hyp_file.is_file():
        raise DataError(
            f"{name}: line {line}: unknown system {shown_name!r}: no text file {hyp_file}; list it "
            f"in prepare.drop_systems.{dataset} with a reason to skip it"
        )
    if drop_empty_mt and _is_blank_line(text.hyp(file_system), sid):
        _count_drop(drops, EMPTY_MT)
        return None
    return _seg_line(text.hyp(file_system), sid, hyp_file, name, line, f"system {file_system} output")


def _is_blank_line(lines: list[str], sid: int) -> bool:
    return 1 <= sid <= len(lines) and not lines[sid - 1].strip()


def _positive_ints(df: pd.DataFrame, column: str, name: str) -> np.ndarray:
    values = numeric_column(df, column, name)
    bad = (values <= 0) | (values != np.floor(values))
    if bad.any():
        pos = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            f"{name}: line {pos + 2}: {column!r} must be a positive integer, got {df[column].iloc[pos]!r}"
        )
    return values.astype("int64").to_numpy()


def _pseudo_doc(prefix: str, seg_id: int, size: int) -> str:
    return f"{prefix}/pseudo-{(seg_id - 1) // size:04d}"


class Newstest2021:
    """The newstest2021 text of one language pair: source, references, system outputs, documents."""

    def __init__(self, root: Path, lp: str, pseudo_doc_size: int):
        self.root = Path(root) / WMT_REPO
        self.lp = lp
        self.src_lang, self.tgt_lang = _lp_parts(lp)
        self.source_file = _require_file(
            self.root / "txt" / "sources" / f"newstest2021.{lp}.src.{self.src_lang}", "source file"
        )
        self.source = read_lines(self.source_file)
        self.ref_files: dict[str, Path] = {}
        for path in sorted(
            (self.root / "txt" / "references").glob(f"newstest2021.{lp}.ref.*.{self.tgt_lang}")
        ):
            self.ref_files[path.name.split(".")[-2]] = path
        self.refs = {letter: read_lines(path) for letter, path in self.ref_files.items()}
        self._hyps: dict[str, list[str]] = {}
        self.pseudo_doc_size = pseudo_doc_size
        self.doc_of_line = self._read_docs()

    def hyp_file(self, system: str) -> Path:
        return self.root / "txt" / "system-outputs" / f"newstest2021.{self.lp}.hyp.{system}.{self.tgt_lang}"

    def hyp(self, system: str) -> list[str]:
        if system not in self._hyps:
            self._hyps[system] = read_lines(self.hyp_file(system))
        return self._hyps[system]

    def _read_docs(self) -> list[str] | None:
        xml_file = self.root / "xml" / f"newstest2021.{self.lp}.all.xml"
        if not xml_file.is_file():
            return None
        try:
            tree = ET.fromstring(decode_text(xml_file.read_bytes(), str(xml_file)))
        except ET.ParseError as exc:
            raise DataError(f"{xml_file}: not well-formed XML: {exc}") from exc
        docs: list[str] = []
        texts: list[str] = []
        for doc in tree.iter("doc"):
            doc_id = doc.get("id")
            if not doc_id:
                raise DataError(f"{xml_file}: a <doc> has no id attribute")
            for src in doc.findall("src"):
                for seg in src.iter("seg"):
                    docs.append(doc_id)
                    texts.append(seg.text or "")
        # The XML can hold more segments than the text files (ru-en: 1843 vs 1000 lines): align
        # each text line, in order, with the next XML segment of the same text.
        doc_of_line: list[str] = []
        j = 0
        for i, line in enumerate(self.source):
            while j < len(texts) and texts[j].strip() != line.strip():
                j += 1
            if j == len(texts):
                raise DataError(
                    f"{xml_file}: line {i + 1} of {self.source_file} is not among its source segments (in order)"
                )
            doc_of_line.append(docs[j])
            j += 1
        return doc_of_line

    def doc(self, sid: int) -> str:
        prefix = f"newstest2021/{self.src_lang}"
        if self.doc_of_line is not None:
            return f"{prefix}/{self.doc_of_line[sid - 1]}"
        return _pseudo_doc(prefix, sid, self.pseudo_doc_size)

    def line_of_da_sid(self) -> list[int] | None:
        """1-based text line of each WMT21 DA segment id (element k-1 for SID k), or None.

        DA SIDs count the segments of the test set's documents **sorted by document id** (string
        order, segments in order inside each document, test-suite documents left out), not the
        lines of the text files.  Without document ids (no ``xml/…all.xml``) the order cannot
        be rebuilt: None.
        """
        if self.doc_of_line is None:
            return None
        # A stable sort keeps each document's segments in file order.
        return sorted(range(1, len(self.doc_of_line) + 1), key=lambda line: self.doc_of_line[line - 1])


def _row(
    *,
    dataset: str,
    lp: str,
    src: str,
    mt: str,
    refs: list[str],
    score: float,
    score_raw: float,
    annotator_scores: list[float],
    n_annotators: int,
    doc: str,
    system: str,
    seg_id: int,
    domain: str,
    year: int,
) -> dict:
    return {
        "dataset": dataset,
        "lp": lp,
        "src": src,
        "mt": mt,
        "ref": refs[0] if refs else None,
        "refs": list(refs),
        "score": float(score),
        "score_raw": float(score_raw),
        "score_std": sample_std(annotator_scores),
        "n_annotators": int(n_annotators),
        "annotator_scores": [float(x) for x in annotator_scores],
        "doc": doc,
        "system": system,
        "seg_id": int(seg_id),
        "domain": domain,
        "year": year,
    }


def _frame(rows: list[dict]) -> pd.DataFrame:
    if not rows:
        raise DataError("loader produced no rows (every row was dropped?)")
    return finish_table(pd.DataFrame(rows))


def _log_drops(dataset: str, lp: str, drops: Mapping[str, int]) -> None:
    for reason, count in sorted(drops.items()):
        if count:
            log.info("%s %s: dropped %d rows: %s", dataset, lp, count, reason)


# ----------------------------------------------------------------------------- WMT21 DA


def _da_annotator_scores(path: Path) -> dict[tuple[str, int], list[float]]:
    """Per (``sys_id``, ``sid``): one standardised score per worker, the mean of that worker's judgements.

    The ``SYSTEM`` and ``REPEAT`` judgements are the ones whose mean is ``Z.SCR``; a ``REPEAT`` is the
    same worker judging the same item again (``WorkerId``), so the worker's judgements are averaged
    into one score: the list counts distinct raters, and its std is the spread between raters, not
    a worker's agreement with itself.  Workers are listed in order of first appearance.
    """
    df = _read_table(path, sep=r"\s+")
    require_columns(df, ("WorkerId", "sys_id", "sid", "score", "type"), str(path))
    lines = np.arange(len(df)) + 2
    keep = df["type"].isin(DA_JUDGEMENT_TYPES).to_numpy()
    df = df[keep]
    scores = numeric_column(df, "score", str(path), rows=pd.Index(lines[keep]))
    sids = numeric_column(df, "sid", str(path), rows=pd.Index(lines[keep])).astype("int64")
    by_worker: dict[tuple[str, int], dict[str, list[float]]] = {}
    for sys_id, sid, worker, score in zip(df["sys_id"], sids, df["WorkerId"], scores, strict=True):
        by_worker.setdefault((sys_id, int(sid)), {}).setdefault(worker, []).append(float(score))
    return {key: [float(np.mean(v)) for v in workers.values()] for key, workers in by_worker.items()}


def load_wmt21_da(
    root: str | Path,
    lps: Iterable[str] = WMT21_DA_LPS,
    *,
    pseudo_doc_size: int = 10,
    drop_systems: Mapping[str, str] | None = None,
    human_reference: Mapping[str, str] | None = None,
    drop_empty_mt: bool = False,
) -> pd.DataFrame:
    """WMT21 to-English segment DA (MTurk, reference-based) with per-annotator scores.

    ``score`` = ``Z.SCR`` (the mean of every ``SYSTEM`` and ``REPEAT`` judgement), ``score_raw`` =
    ``RAW.SCR`` (0-100), ``annotator_scores`` = one standardised score per distinct worker
    (``WorkerId``) of ``ad-<xxen>-good-stnd.csv`` matched on (``SYS``, ``SID``): the mean of that
    worker's ``SYSTEM`` and ``REPEAT`` judgements (the REF and BAD_REF quality-control items are
    excluded), ``n_annotators`` = the number of those workers (``N``, which counts judgements, for
    an item good-stnd lacks).  The mean of ``annotator_scores`` is ``Z.SCR`` wherever an item's
    workers judged it equally often (every item of the pinned files).  ``HUMAN`` is the reference named in
    ``human_reference[lp]``: its text is that reference and its ``ref``/``refs`` the other
    references; rows are dropped (and counted in the log) when that reference file is absent or
    no other reference exists.

    ``SID`` is **not** a line number: SID k is the k-th segment once the test set's documents
    are sorted by document id (:meth:`Newstest2021.line_of_da_sid`).  Language pairs without
    published document ids (cs-en, de-en, ha-en, zh-en) cannot be joined and are left out:
    logged, and listed with the reason in ``df.attrs["left_out"]`` (``{lp: reason}``), which
    ``uamt data prepare`` writes to ``summary.json``.  Never guess an order.
    """
    root = Path(root)
    drop_systems = dict(drop_systems or {})
    human_reference = DEFAULT_HUMAN_REFERENCE if human_reference is None else dict(human_reference)
    humaneval = root / WMT_REPO / "humaneval" / "newstest2021-toen"
    rows: list[dict] = []
    left_out: dict[str, str] = {}
    for lp in _check_lps(lps, WMT21_DA_LPS, "wmt21_da"):
        text = Newstest2021(root, lp, pseudo_doc_size)
        line_of_sid = text.line_of_da_sid()
        if line_of_sid is None:
            left_out[lp] = NO_DOC_ORDER
            log.warning("wmt21_da %s: left out: %s", lp, NO_DOC_ORDER)
            continue
        score_path = _require_file(humaneval / f"ad-seg-scores-{lp}.csv", "DA score file")
        name = str(score_path)
        df = _read_table(score_path, sep=r"\s+")
        require_columns(df, ("SYS", "SID", "RAW.SCR", "Z.SCR", "N"), name)
        sids = _positive_ints(df, "SID", name)
        beyond = np.flatnonzero(sids > len(line_of_sid))
        if beyond.size:
            raise DataError(
                f"{name}: line {int(beyond[0]) + 2}: segment id {int(sids[beyond[0]])} is beyond the "
                f"{len(line_of_sid)} segments of the {lp} test set"
            )
        raw = numeric_column(df, "RAW.SCR", name).to_numpy()
        z = numeric_column(df, "Z.SCR", name).to_numpy()
        check_range(z, DA_Z_RANGE, name, "Z.SCR", "DA z-score")
        check_range(raw, RAW_DA_RANGE, name, "RAW.SCR", "raw DA score (0-100)")
        check_unique_keys(
            list(zip(df["SYS"], sids.tolist(), strict=True)),
            z,
            np.arange(len(df)) + 2,
            name,
            "(system, segment)",
        )
        n_ann = _positive_ints(df, "N", name)
        stnd_path = humaneval / f"ad-{lp.replace('-', '')}-good-stnd.csv"
        per_annotator = _da_annotator_scores(stnd_path) if stnd_path.is_file() else {}
        letters = sorted(text.refs)
        drops: dict[str, int] = {}
        for i, sys_id in enumerate(df["SYS"]):
            line = i + 2
            system = sys_id.rsplit(".", 1)[0] if "." in sys_id else sys_id
            system = SYSTEM_ALIASES.get(system, system)
            sid = int(sids[i])
            seg = line_of_sid[sid - 1]  # the text line that DA segment id judged
            if _system_dropped(system, drop_systems, drops):
                continue
            if system == "HUMAN":
                if lp not in human_reference:
                    raise DataError(
                        f"{name}: line {line}: system HUMAN in {lp}, but prepare.human_reference names no "
                        f"reference for {lp} (references present: {letters})"
                    )
                letter = human_reference[lp]
                others = [x for x in letters if x != letter]
                if letter not in text.refs:
                    _count_drop(drops, f"HUMAN = reference {letter}, whose text is not in the data")
                    continue
                if not others:
                    _count_drop(
                        drops, f"HUMAN = reference {letter}, and no other reference to score it against"
                    )
                    continue
                mt = _seg_line(
                    text.refs[letter], seg, text.ref_files[letter], name, line, f"reference {letter}"
                )
                system_name = f"HUMAN-ref{letter}"
            else:
                others = letters
                mt = _system_output(text, system, sys_id, seg, name, line, "wmt21_da", drop_empty_mt, drops)
                if mt is None:
                    continue
                system_name = system
            src = _seg_line(text.source, seg, text.source_file, name, line, "source")
            refs = [
                _seg_line(text.refs[x], seg, text.ref_files[x], name, line, f"reference {x}") for x in others
            ]
            ann = per_annotator.get((sys_id, sid), [])
            rows.append(
                _row(
                    dataset="wmt21_da",
                    lp=lp,
                    src=src,
                    mt=mt,
                    refs=refs,
                    score=z[i],
                    score_raw=raw[i],
                    annotator_scores=ann,
                    n_annotators=len(ann) if ann else n_ann[i],
                    doc=text.doc(seg),
                    system=system_name,
                    seg_id=seg,
                    domain="news",
                    year=2021,
                )
            )
        _log_drops("wmt21_da", lp, drops)
    if not rows:
        raise DataError(f"wmt21_da: no language pair of {list(lps)} can be joined: {left_out}")
    out = _frame(rows)
    out.attrs["left_out"] = left_out
    return out


# ----------------------------------------------------------------------------- MQM


def _mqm_scores(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """Rated rows of an ``avg_seg_scores.tsv`` (``None`` = not rated, dropped) and their file lines."""
    name = str(path)
    df = _read_table(path, sep=r"\s+")
    require_columns(df, ("system", "mqm_avg_score", "seg_id"), name)
    lines = np.arange(len(df)) + 2
    rated = (df["mqm_avg_score"] != "None").to_numpy()
    df, lines = df[rated].reset_index(drop=True), lines[rated]
    df["score"] = numeric_column(df, "mqm_avg_score", name, rows=pd.Index(lines))
    df["seg_id"] = numeric_column(df, "seg_id", name, rows=pd.Index(lines)).astype("int64")
    check_range(df["score"], MQM_RANGE, name, "mqm_avg_score", "MQM score", rows=lines)
    check_unique_keys(
        list(zip(df["system"], df["seg_id"].tolist(), strict=True)),
        df["score"].to_numpy(),
        lines,
        name,
        "(system, segment)",
    )
    bad = df["seg_id"] < 1
    if bad.any():
        pos = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{name}: line {lines[pos]}: seg_id must be >= 1")
    return df, lines


def _other_refs(own: str, available: Mapping[str, str]) -> list[str]:
    """References other than ``own`` in alphabetical order of their names."""
    return [available[k] for k in sorted(available) if k != own]


def refs_of_row(own: str | None, available: Mapping[str, str]) -> list[str] | None:
    """The references of a rated row, in alphabetical order of their names.

    A system (``own`` None) is scored against every available reference; a rated human reference
    ``own`` against the others, and None when there is no other (the caller drops the row).
    """
    if own is None:
        return [available[k] for k in sorted(available)]
    return _other_refs(own, available) or None


def _qe_on_lines(root: Path, lp: str, text: Newstest2021, dataset: str):
    """The QE-2023 judgements of newstest2021 ``lp`` placed on the lines of ``text.source``.

    Returns (QeFile, QeJoin, {(system, line): judgements}); judgements whose source is in no line
    are left out and counted in the log.
    """
    qe = wmt21_qe.read_qe_file(wmt21_qe.qe_path(root, lp))
    join = wmt21_qe.join_source(qe, text.source, text.source_file)
    n = len(qe.judgements)
    log.info(
        "%s %s: %d of %d QE rows placed on lines of %s (%d with the same text, the rest under "
        "wmt21_qe.match_key); %d rows whose source is in no line dropped",
        dataset,
        lp,
        join.matched,
        n,
        text.source_file.name,
        join.exact,
        n - join.matched,
    )
    return qe, join, wmt21_qe.group_judgements(qe, join.line_of)


def _qe_target(
    qe: wmt21_qe.QeFile,
    judgement: wmt21_qe.QeJudgement | None,
    system: str,
    drop_empty_mt: bool,
    drops: dict[str, int],
) -> str | None:
    """The QE file's text of a system without a published text file; None (counted) where absent."""
    if judgement is None:
        _count_drop(drops, f"system {system}: no text (segment not in the QE file)")
        return None
    if judgement.empty_target:
        if drop_empty_mt:
            _count_drop(drops, EMPTY_MT)
            return None
        raise DataError(
            f"{qe.name}: line {judgement.line}: system {system} output is empty "
            f"({wmt21_qe.EMPTY_TARGET!r}); set prepare.drop_empty_mt to drop it"
        )
    return judgement.target


def _check_qe_text(
    lp: str, text: Newstest2021, groups: Mapping[tuple[str, int], list[wmt21_qe.QeJudgement]], name: str
) -> None:
    """Raise when the QE targets of published systems differ from their text (join on wrong lines)."""
    same = total = 0
    for (system, line), judgements in groups.items():
        match = _REF_SYSTEM.match(system)
        if match:
            published = text.refs.get(match.group(1))
        else:
            path = text.hyp_file(SYSTEM_ALIASES.get(system, system))
            published = text.hyp(SYSTEM_ALIASES.get(system, system)) if path.is_file() else None
        if published is None or line > len(published):
            continue
        target = judgements[0]
        total += 1
        if target.empty_target:
            same += not published[line - 1].strip()
        else:
            same += wmt21_qe.match_key(target.target) == wmt21_qe.match_key(published[line - 1])
    if total and same < QE_TEXT_AGREEMENT * total:
        raise DataError(
            f"{name}: only {same} of {total} targets of systems published in wmt21-news-systems equal "
            f"their newstest2021 {lp} text: the QE rows are not on the lines their source matched"
        )
    log.info("wmt21_mqm %s: %d of %d QE targets equal the published system/reference text", lp, same, total)


def _real_docs(rows: list[dict], doc_of_line: Mapping[int, str], prefix: str, where: str) -> None:
    """Give every row the QE file's document of its line (``<prefix>/<doc id>``), in place.

    All or nothing: if one row's line has no document, the rows keep their pseudo-documents, since
    a mix could put the lines of one real document under two keys (its own and a pseudo one).
    """
    missing = [r["seg_id"] for r in rows if r["seg_id"] not in doc_of_line]
    if missing:
        log.warning(
            "%s: %d rows on lines without a document in the QE file (e.g. line %d): pseudo-documents kept",
            where,
            len(missing),
            missing[0],
        )
        return
    for r in rows:
        r["doc"] = f"{prefix}/{doc_of_line[r['seg_id']]}"


def _qe_rows(
    dataset: str,
    lp: str,
    qe: wmt21_qe.QeFile,
    groups: Mapping[tuple[str, int], list[wmt21_qe.QeJudgement]],
    *,
    src_of,
    doc_of,
    domain: str,
    rename: Mapping[str, str],
    drop_systems: Mapping[str, str],
    drop_empty_mt: bool,
    drops: dict[str, int],
) -> list[dict]:
    """Rows of a language pair scored from the QE file's per-rater errors (no Google scores).

    ``score`` = ``score_raw`` = mean over the raters of their MQM scores
    (:attr:`wmt21_qe.QeJudgement.score`: 0 best, negative worse, floored at -25),
    ``annotator_scores`` = those scores, ``n_annotators`` = the number of raters.  ``mt`` = the
    file's target; ``refs`` = the targets of the file's rated references ``ref-X`` of the segment
    (alphabetical), a rated reference's own row getting the *other* ones (dropped without).
    ``src_of(seg, judgement)`` / ``doc_of(seg, judgement)`` give ``src`` and ``doc``; ``rename``
    maps system names (e.g. ``Nemo``).
    """
    ref_texts: dict[int, dict[str, str]] = {}
    for (system, seg), judgements in groups.items():
        match = _REF_SYSTEM.match(system)
        if match:
            ref_texts.setdefault(seg, {})[match.group(1)] = judgements[0].target
    rows: list[dict] = []
    floored = 0
    for (system, seg), judgements in groups.items():
        if _system_dropped(system, drop_systems, drops):
            continue
        match = _REF_SYSTEM.match(system)
        refs = refs_of_row(match.group(1) if match else None, ref_texts.get(seg, {}))
        if refs is None:
            _count_drop(drops, f"rated reference {system}: no other reference")
            continue
        first = judgements[0]
        mt = _qe_target(qe, first, system, drop_empty_mt, drops)
        if mt is None:
            continue
        scores = [j.score for j in judgements]
        floored += sum(j.penalty < wmt21_qe.MQM_FLOOR for j in judgements)
        rows.append(
            _row(
                dataset=dataset,
                lp=lp,
                src=src_of(seg, first),
                mt=mt,
                refs=refs,
                score=float(np.mean(scores)),
                score_raw=float(np.mean(scores)),
                annotator_scores=scores,
                n_annotators=len(scores),
                doc=doc_of(seg, first),
                system=rename.get(system, system),
                seg_id=seg,
                domain=domain,
                year=2021,
            )
        )
    if floored:
        log.info(
            "%s %s: %d rater scores below %g floored (more than five errors marked)",
            dataset,
            lp,
            floored,
            wmt21_qe.MQM_FLOOR,
        )
    return rows


def load_wmt21_mqm(
    root: str | Path,
    lps: Iterable[str] = WMT21_MQM_LPS,
    *,
    pseudo_doc_size: int = 10,
    drop_systems: Mapping[str, str] | None = None,
    drop_empty_mt: bool = False,
) -> pd.DataFrame:
    """newstest2021 expert MQM (en-de, zh-en, en-ru) joined with the WMT21 text.

    Scores are MQM: 0 best, negative worse, in [-25, 0]; ``score_raw`` = ``score``.

    en-de, zh-en
        ``score`` = Google's ``avg_seg_scores`` (one published score per item:
        ``annotator_scores = [score]``, ``n_annotators = 1``); ``seg_id`` = its segment id = line of
        ``newstest2021.<lp>.src.*``, whose line is ``src``.  ``mt``: wmt21-news-systems, and for the
        systems and rated references it does not publish (``metricsystem1-5``, ``ref-B``) the target
        of the QE-2023 file (:mod:`uamt.data.sources.wmt21_qe`, a lightly normalised copy of the
        text), placed on lines by its source text.  Items without text in either are dropped
        (logged); QE judgements without a Google score (en-de ``ref-C``/``ref-D`` on unrated lines)
        are not used.
    en-ru
        Neither Google scores nor newstest2021 en-ru text are in the data: everything comes from the
        QE file.  ``score`` = mean over raters of each rater's MQM score of the marked severities
        (:attr:`uamt.data.sources.wmt21_qe.QeJudgement.score`: no error categories in the file, so
        no 0.1 punctuation / 25 non-translation weights; floored at -25), ``annotator_scores`` =
        per-rater scores, ``n_annotators`` = number of raters.  ``seg_id`` = line of the English
        source the en-X test sets share (``newstest2021.en-de.src.en``: every rated en-ru source
        is there, at the same document position), whose line is ``src``; ``mt`` and the references
        are the QE file's targets.

    ``refs`` of a system row = the language pair's references in alphabetical order of their
    letters: the reference files of wmt21-news-systems (en-de A, C, D; zh-en A) or the rated
    references of the QE file (en-ru A, B).  A QE-only reference of en-de/zh-en (``ref-B``) is a
    rated row, not a reference of the others (its text is normalised, and the reference
    experiments use the published files).  A rated reference ``ref-X`` gets ``refs`` = the other
    references and is dropped (logged) without one (zh-en ``ref-A``).

    ``doc`` = ``newstest2021/<source language>/<document id>`` from the QE file, the same key for
    the same English document in en-de and en-ru.  Every rated line of the three language pairs
    has one; should a row's line have none, the whole language pair keeps pseudo-documents
    (``pseudo_doc_size``), so no real document is split between two keys.
    """
    root = Path(root)
    if drop_systems is None:
        drop_systems = DEFAULT_DROP_SYSTEMS.get("wmt21_mqm", {})
    drop_systems = dict(drop_systems)
    rows: list[dict] = []
    for lp in _check_lps(lps, WMT21_MQM_LPS, "wmt21_mqm"):
        src_lang, _ = _lp_parts(lp)
        if lp in SHARED_SOURCE_LP:
            text = Newstest2021(root, SHARED_SOURCE_LP[lp], pseudo_doc_size)
            qe, join, groups = _qe_on_lines(root, lp, text, "wmt21_mqm")
            drops: dict[str, int] = {}
            lp_rows = _qe_rows(
                "wmt21_mqm",
                lp,
                qe,
                groups,
                src_of=lambda seg, j, text=text, qe=qe: _seg_line(
                    text.source, seg, text.source_file, qe.name, j.line, "source"
                ),
                doc_of=lambda seg, j, text=text: text.doc(seg),
                domain="news",
                rename=SYSTEM_ALIASES,
                drop_systems=drop_systems,
                drop_empty_mt=drop_empty_mt,
                drops=drops,
            )
            _real_docs(lp_rows, join.doc_of_line, f"newstest2021/{src_lang}", f"wmt21_mqm {lp}")
            rows.extend(lp_rows)
            _log_drops("wmt21_mqm", lp, drops)
            continue
        text = Newstest2021(root, lp, pseudo_doc_size)
        path = _require_file(
            root
            / MQM_REPO
            / "newstest2021"
            / lp.replace("-", "")
            / f"mqm_newstest2021_{lp.replace('-', '')}.avg_seg_scores.tsv",
            "MQM score file",
        )
        name = str(path)
        df, lines = _mqm_scores(path)
        # The QE file is read after the score file, so a bad score file is reported first.
        qe, join, groups = _qe_on_lines(root, lp, text, "wmt21_mqm")
        _check_qe_text(lp, text, groups, qe.name)
        qe_systems = {j.system for j in qe.judgements}
        rated = set(zip(df["system"], df["seg_id"].tolist(), strict=True))
        unscored = sum(len(v) for k, v in groups.items() if k not in rated)
        if unscored:
            log.info(
                "wmt21_mqm %s: %d QE rows have no Google score (not rated there): not used", lp, unscored
            )
        drops = {}
        lp_rows = []
        for i, (system, sid, score) in enumerate(zip(df["system"], df["seg_id"], df["score"], strict=True)):
            line = int(lines[i])
            sid = int(sid)
            if _system_dropped(system, drop_systems, drops):
                continue
            match = _REF_SYSTEM.match(system)
            ref_texts = {
                x: _seg_line(text.refs[x], sid, text.ref_files[x], name, line, f"reference {x}")
                for x in text.refs
            }
            qe_item = (groups.get((system, sid)) or [None])[0]
            if match:
                letter = match.group(1)
                if letter in text.refs:
                    mt = ref_texts[letter]
                elif qe_item is not None:
                    mt = qe_item.target
                else:
                    _count_drop(
                        drops,
                        f"rated reference {system}: its text is in neither wmt21-news-systems nor the QE file",
                    )
                    continue
                refs = _other_refs(letter, ref_texts)
                if not refs:
                    _count_drop(drops, f"rated reference {system}: no other reference")
                    continue
            else:
                file_system = SYSTEM_ALIASES.get(system, system)
                if text.hyp_file(file_system).is_file() or system not in qe_systems:
                    # published text; a system in neither source is an error naming the score line
                    mt = _system_output(
                        text, file_system, system, sid, name, line, "wmt21_mqm", drop_empty_mt, drops
                    )
                else:
                    mt = _qe_target(qe, qe_item, system, drop_empty_mt, drops)
                if mt is None:
                    continue
                refs = [ref_texts[x] for x in sorted(ref_texts)]
                system = file_system
            src = _seg_line(text.source, sid, text.source_file, name, line, "source")
            lp_rows.append(
                _row(
                    dataset="wmt21_mqm",
                    lp=lp,
                    src=src,
                    mt=mt,
                    refs=refs,
                    score=score,
                    score_raw=score,
                    annotator_scores=[score],
                    n_annotators=1,
                    doc=text.doc(sid),
                    system=system,
                    seg_id=sid,
                    domain="news",
                    year=2021,
                )
            )
        _real_docs(lp_rows, join.doc_of_line, f"newstest2021/{src_lang}", f"wmt21_mqm {lp}")
        rows.extend(lp_rows)
        _log_drops("wmt21_mqm", lp, drops)
    return _frame(rows)


def _ted_text(path: Path) -> dict[tuple[str, int], tuple[str, str, str, int]]:
    """(system, seg_id) -> (source, target without ``<v>`` marks, doc, first file line)."""
    name = str(path)
    df = _read_table(path, sep="\t")
    require_columns(df, ("system", "doc", "seg_id", "source", "target"), name)
    seg_ids = numeric_column(df, "seg_id", name).astype("int64")
    out: dict[tuple[str, int], tuple[str, str, str, int]] = {}
    for i, (system, doc, sid, source, target) in enumerate(
        zip(df["system"], df["doc"], seg_ids, df["source"], df["target"], strict=True)
    ):
        key = (TED_REF_SYSTEMS.get(system, system), int(sid))
        if key in out:
            continue
        line = i + 2
        check_text(source, name, line, "source")
        check_text(doc, name, line, "doc")
        out[key] = (source, check_text(_SPAN_MARK.sub("", target), name, line, "target"), doc, line)
    return out


def _ted_mqm_qe(root: Path, lp: str, drop_systems: Mapping[str, str]) -> list[dict]:
    """TED MQM rows of ``lp`` from the QE-2023 file alone (scores, text: :func:`_qe_rows`).

    ``seg_id`` numbers the (talk, position) pairs in order of first appearance in the file
    (:func:`wmt21_qe.number_segments`: talk order, then position); ``doc`` = ``ted/<source
    language>/<talk>`` as the file names it; ``src`` = the file's source.
    """
    src_lang, _ = _lp_parts(lp)
    qe = wmt21_qe.read_qe_file(wmt21_qe.qe_path(root, lp, ted=True))
    segments = wmt21_qe.number_segments(qe)
    lost = sum(seg is None for seg in segments)
    if lost:
        log.info("ted_mqm %s: dropped %d QE rows whose position in the talk was lost", lp, lost)
    drops: dict[str, int] = {}
    rows = _qe_rows(
        "ted_mqm",
        lp,
        qe,
        wmt21_qe.group_judgements(qe, segments),
        src_of=lambda seg, j: j.source,
        doc_of=lambda seg, j: f"ted/{src_lang}/{j.doc}",
        domain="ted",
        rename={},
        drop_systems=drop_systems,
        drop_empty_mt=False,
        drops=drops,
    )
    _log_drops("ted_mqm", lp, drops)
    return rows


def load_ted_mqm(
    root: str | Path, lps: Iterable[str] = TED_MQM_LPS, *, drop_systems: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """WMT21 TED-talk expert MQM (out-of-domain): 0 best, negative worse, in [-25, 0].

    en-de, zh-en: text from ``mqm_ted_<lp>.tsv``, ``score`` = ``score_raw`` = Google's
    ``avg_seg_scores`` (one rater per segment: ``annotator_scores = [score]``).  Reference of a
    segment = target of the system ``ref`` (= ``ref-A`` in the score file), and for zh-en also
    ``refB`` (= ``ref-B``).  The references' own rated rows follow the newstest rule: kept with
    ``ref`` = the other reference (zh-en), dropped where there is none (en-de).  Metric-selected
    systems (``metricsystem*``) have text here and are kept.

    en-ru (no Google file): from the QE-2023 file ``2021_TED_en-ru_processed.tsv``, scored from its
    per-rater errors as WMT21 news en-ru (:func:`load_wmt21_mqm`, :func:`_ted_mqm_qe`); its only
    reference ``ref-A`` is the reference of every system row, its own rated rows are dropped.
    """
    root = Path(root)
    drop_systems = dict(drop_systems or {})
    rows: list[dict] = []
    for lp in _check_lps(lps, TED_MQM_LPS, "ted_mqm"):
        src_lang, _ = _lp_parts(lp)
        if lp in QE_ONLY_TED_LPS:
            rows.extend(_ted_mqm_qe(root, lp, drop_systems))
            continue
        folder = root / MQM_REPO / "ted" / lp.replace("-", "")
        text_path = _require_file(folder / f"mqm_ted_{lp.replace('-', '')}.tsv", "TED MQM text file")
        score_path = _require_file(
            folder / f"mqm_ted_{lp.replace('-', '')}.avg_seg_scores.tsv", "TED MQM score file"
        )
        texts = _ted_text(text_path)
        ref_names = sorted({s for s, _ in texts if _REF_SYSTEM.match(s)})
        df, lines = _mqm_scores(score_path)
        name = str(score_path)
        drops: dict[str, int] = {}
        no_ref = 0
        for i, (system, sid, score) in enumerate(zip(df["system"], df["seg_id"], df["score"], strict=True)):
            sid = int(sid)
            if _system_dropped(system, drop_systems, drops):
                continue
            if (system, sid) not in texts:
                raise DataError(
                    f"{name}: line {lines[i]}: unknown system {system!r} or segment {sid}: no text for it in "
                    f"{text_path}; list it in prepare.drop_systems.ted_mqm with a reason to skip it"
                )
            src, mt, doc, _ = texts[(system, sid)]
            ref_texts = {r: texts[(r, sid)][1] for r in ref_names if (r, sid) in texts}
            is_reference = _REF_SYSTEM.match(system) is not None
            refs = refs_of_row(system if is_reference else None, ref_texts)
            if refs is None:
                _count_drop(drops, f"rated reference {system}: no other reference")
                continue
            no_ref += not refs
            rows.append(
                _row(
                    dataset="ted_mqm",
                    lp=lp,
                    src=src,
                    mt=mt,
                    refs=refs,
                    score=score,
                    score_raw=score,
                    annotator_scores=[score],
                    n_annotators=1,
                    doc=f"ted/{src_lang}/{doc}",
                    system=system,
                    seg_id=sid,
                    domain="ted",
                    year=2021,
                )
            )
        _log_drops("ted_mqm", lp, drops)
        if no_ref:
            log.info("ted_mqm %s: %d rows kept without a reference (no ref text for the segment)", lp, no_ref)
    return _frame(rows)


# ----------------------------------------------------------------------------- MLQE


def _tar_members(path: Path) -> dict[str, bytes]:
    try:
        with tarfile.open(path, "r:gz") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read the tarball: {exc}") from exc


def _score_list(value: str, name: str, line: int, column: str) -> list[float]:
    try:
        parsed = ast.literal_eval(value)
        values = [float(x) for x in parsed]
    except (ValueError, SyntaxError, TypeError) as exc:
        raise DataError(
            f"{name}: line {line}: column {column!r} must be a list of numbers, got {value!r}"
        ) from exc
    if not values or not np.all(np.isfinite(values)):
        raise DataError(f"{name}: line {line}: column {column!r} must hold finite numbers, got {value!r}")
    return values


def load_mlqe(root: str | Path, lps: Iterable[str] = MLQE_LPS) -> pd.DataFrame:
    """MLQE (WMT20 QE task 1) train, dev and test20: Wikipedia sentences, one NMT system, no references.

    ``score`` = ``z_mean``, ``score_raw`` = ``mean`` (raw DA 0-100), ``annotator_scores`` =
    ``z_scores`` (per-annotator z-scores, the ``score`` scale; the raw 0-100 list is ``scores``),
    ``n_annotators`` = number of annotators.  ``seg_id`` numbers train, dev, test20 rows
    consecutively from 1; ``system`` = ``mlqe-nmt``.
    """
    root = Path(root)
    rows: list[dict] = []
    for lp in _check_lps(lps, MLQE_LPS, "mlqe"):
        src_lang, tgt_lang = _lp_parts(lp)
        code = f"{src_lang}{tgt_lang}"
        members: dict[str, bytes] = {}
        tars: dict[str, Path] = {}
        for tar_name in (f"{lp}.tar.gz", f"{lp}_test.tar.gz"):
            tar_path = _require_file(root / MLQE_REPO / "data" / tar_name, "MLQE tarball")
            for member, data in _tar_members(tar_path).items():
                members[member] = data
                tars[member] = tar_path
        seg_id = 0
        for part in ("train", "dev", "test20"):
            tsv, ids = f"{lp}/{part}.{code}.df.short.tsv", f"{lp}/{part}.doc_ids"
            for member in (tsv, ids):
                if member not in members:
                    raise DataError(
                        f"{root / MLQE_REPO / 'data'}: member {member} not found in the {lp} tarballs"
                    )
            name = f"{tars[tsv]}:{tsv}"
            df = _read_table(Path(name), sep="\t", name=name, data=members[tsv])
            require_columns(df, ("original", "translation", "scores", "mean", "z_scores", "z_mean"), name)
            doc_lines = decode_lines(members[ids], f"{tars[ids]}:{ids}")
            if doc_lines and doc_lines[0].strip() == "doc_id":
                doc_lines = doc_lines[1:]
            if len(doc_lines) != len(df):
                raise DataError(
                    f"{tars[ids]}:{ids}: {len(doc_lines)} document ids for the {len(df)} rows of {name}"
                )
            z_mean = numeric_column(df, "z_mean", name).to_numpy()
            mean = numeric_column(df, "mean", name).to_numpy()
            check_range(z_mean, DA_Z_RANGE, name, "z_mean", "DA z-score")
            check_range(mean, RAW_DA_RANGE, name, "mean", "raw DA score (0-100)")
            for i in range(len(df)):
                line = i + 2
                src = check_text(df["original"].iat[i], name, line, "original")
                mt = check_text(df["translation"].iat[i], name, line, "translation")
                raw_scores = _score_list(df["scores"].iat[i], name, line, "scores")
                z_scores = _score_list(df["z_scores"].iat[i], name, line, "z_scores")
                doc = check_text(doc_lines[i], f"{tars[ids]}:{ids}", i + 2, "doc_id")
                seg_id += 1
                rows.append(
                    _row(
                        dataset="mlqe",
                        lp=lp,
                        src=src,
                        mt=mt,
                        refs=[],
                        score=z_mean[i],
                        score_raw=mean[i],
                        annotator_scores=z_scores,
                        n_annotators=len(raw_scores),
                        doc=f"mlqe/{src_lang}/{doc.strip()}",
                        system="mlqe-nmt",
                        seg_id=seg_id,
                        domain="wiki",
                        year=2020,
                    )
                )
    return _frame(rows)


# ----------------------------------------------------------------------------- QT21 HTER


def load_qt21_hter(
    root: str | Path,
    files: Iterable[tuple[str, str]] = QT21_FILES,
    *,
    pseudo_doc_size: int = 10,
) -> pd.DataFrame:
    """QT21 HTER test sets from UA_COMET (``test.<nmt|smt>.<lp>.csv``): src, mt, ref, HTER.

    ``score`` = ``score_raw`` = HTER (0 best, higher worse); ``system`` = ``nmt``/``smt``;
    ``seg_id`` = 1-based row in its file; documents = contiguous blocks of ``pseudo_doc_size``
    rows.  ``test.csv`` is the union of these files and is not read (its rows would duplicate).
    """
    root = Path(root)
    folder = root / HTER_REPO / "evaluation" / "data" / "human_scores" / "hter"
    rows: list[dict] = []
    for system, lp in files:
        if (system, lp) not in QT21_FILES:
            raise DataError(
                f"qt21_hter: file ({system!r}, {lp!r}) not supported; choose from {list(QT21_FILES)}"
            )
        path = _require_file(folder / f"test.{system}.{lp}.csv", "HTER file")
        name = str(path)
        df = _read_table(path, sep=",")
        require_columns(df, ("src", "mt", "ref", "lp", "score"), name)
        scores = numeric_column(df, "score", name).to_numpy()
        check_range(scores, HTER_RANGE, name, "score", "HTER")
        src_lang, _ = _lp_parts(lp)
        for i in range(len(df)):
            line = i + 2
            if df["lp"].iat[i] != lp:
                raise DataError(f"{name}: line {line}: lp {df['lp'].iat[i]!r} differs from the file's {lp!r}")
            src = check_text(df["src"].iat[i], name, line, "src")
            mt = check_text(df["mt"].iat[i], name, line, "mt")
            ref = check_text(df["ref"].iat[i], name, line, "ref")
            rows.append(
                _row(
                    dataset="qt21_hter",
                    lp=lp,
                    src=src,
                    mt=mt,
                    refs=[ref],
                    score=scores[i],
                    score_raw=scores[i],
                    annotator_scores=[scores[i]],
                    n_annotators=1,
                    doc=_pseudo_doc(f"qt21/{src_lang}/{lp}.{system}", i + 1, pseudo_doc_size),
                    system=system,
                    seg_id=i + 1,
                    domain=QT21_DOMAIN.get(lp, "life_sciences"),
                    year=2017,
                )
            )
    return _frame(rows)


# ----------------------------------------------------------------------------- multi-hypothesis et-en


MULTIHYP_FILES = ("src.et", "mt.en", "ref-1.en", "ref-2.en", "DA-z.scores")


def load_multihyp_eten(root: str | Path, *, pseudo_doc_size: int = 10) -> pd.DataFrame:
    """The Estonian-English 1K set of *Multi-Hypothesis MT Evaluation*: two references, DA z-scores.

    ``score`` = ``score_raw`` = DA z-score (raw DA not published); per-annotator scores are not
    published: ``annotator_scores = []``, ``n_annotators = 0`` (unknown).  ``refs`` = [ref-1, ref-2].
    """
    root = Path(root)
    tar_path = _require_file(root / MLQE_REPO / "data-multi-hyp" / "data.tar.gz", "multi-hypothesis tarball")
    members = {Path(k).name: (k, v) for k, v in _tar_members(tar_path).items()}
    lines: dict[str, list[str]] = {}
    for fname in MULTIHYP_FILES:
        if fname not in members:
            raise DataError(f"{tar_path}: member {fname} not found")
        lines[fname] = decode_lines(members[fname][1], f"{tar_path}:{members[fname][0]}")
    n = len(lines["DA-z.scores"])
    for fname in MULTIHYP_FILES:
        if len(lines[fname]) != n:
            raise DataError(
                f"{tar_path}:{members[fname][0]}: {len(lines[fname])} lines, but DA-z.scores has {n} scores"
            )
    score_name = f"{tar_path}:{members['DA-z.scores'][0]}"
    scores = numeric_column(pd.DataFrame({"DA-z": lines["DA-z.scores"]}), "DA-z", score_name, first_line=1)
    check_range(scores, DA_Z_RANGE, score_name, "DA-z", "DA z-score", first_line=1)
    rows: list[dict] = []
    for i in range(n):
        texts = {
            f: check_text(lines[f][i], f"{tar_path}:{members[f][0]}", i + 1, f) for f in MULTIHYP_FILES[:4]
        }
        rows.append(
            _row(
                dataset="multihyp_eten",
                lp="et-en",
                src=texts["src.et"],
                mt=texts["mt.en"],
                refs=[texts["ref-1.en"], texts["ref-2.en"]],
                score=scores.iat[i],
                score_raw=scores.iat[i],
                annotator_scores=[],
                n_annotators=0,
                doc=_pseudo_doc("multihyp/et", i + 1, pseudo_doc_size),
                system="multihyp-mt",
                seg_id=i + 1,
                domain="wiki",
                year=2020,
            )
        )
    return _frame(rows)
