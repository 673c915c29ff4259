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

from uamt.data.schema import (
    RAW_DA_RANGE,
    SCORE_RANGES,
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
from uamt.errors import DataError

log = logging.getLogger(__name__)

WMT_REPO = "wmt-conference/wmt21-news-systems"
MQM_REPO = "google/wmt-mqm-human-evaluation"
MLQE_REPO = "facebookresearch/mlqe"
HTER_REPO = "deep-spin/UA_COMET"

WMT21_DA_LPS = ("cs-en", "de-en", "ha-en", "is-en", "ja-en", "ru-en", "zh-en")
WMT21_MQM_LPS = ("en-de", "zh-en")
TED_MQM_LPS = ("en-de", "zh-en")
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
#: The judgement type of ordinary DA items in ``ad-*-good-stnd.csv`` (others: REF, REPEAT, BAD_REF).
ORDINARY_DA_TYPE = "SYSTEM"
#: Which reference file WMT21 to-English ``HUMAN`` is.  Not stated in the files; HUMAN's
#: mean standardised score (about -0.07 in cs-en/de-en, 0.08 in ru-en) is that of an ordinary
#: system, not that of the REF quality-control items (0.7-0.9) in which annotators compare
#: reference A with itself, so HUMAN is the second reference, B (as in the WMT21 findings).
DEFAULT_HUMAN_REFERENCE = {"cs-en": "B", "de-en": "B", "ru-en": "B", "zh-en": "B"}
DEFAULT_DROP_SYSTEMS = {"wmt21_mqm": {"metricsystem*": "metric-selected outputs, no text published"}}
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
        drops[EMPTY_MT] = drops.get(EMPTY_MT, 0) + 1
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
    """Per (``sys_id``, ``sid``): the standardised scores of the ordinary (``SYSTEM``) judgements."""
    df = _read_table(path, sep=r"\s+")
    require_columns(df, ("sys_id", "sid", "score", "type"), str(path))
    lines = np.arange(len(df)) + 2
    keep = (df["type"] == ORDINARY_DA_TYPE).to_numpy()
    df = df[keep]
    scores = numeric_column(df, "score", str(path), rows=pd.Index(lines[keep]))
    sids = numeric_column(df, "sid", str(path), rows=pd.Index(lines[keep])).astype("int64")
    out: dict[tuple[str, int], list[float]] = {}
    for sys_id, sid, score in zip(df["sys_id"], sids, scores, strict=True):
        out.setdefault((sys_id, int(sid)), []).append(float(score))
    return out


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

    ``score`` = ``Z.SCR``, ``score_raw`` = ``RAW.SCR`` (0-100), ``n_annotators`` = ``N``,
    ``annotator_scores`` = the standardised scores of the ordinary ``SYSTEM`` judgements of
    ``ad-<xxen>-good-stnd.csv`` matched on (``SYS``, ``SID``) (REF, BAD_REF and REPEAT
    quality-control items excluded, so the list can be shorter than ``N``); zh-en has no such
    file and gets ``[]``.  ``HUMAN`` is the reference named in ``human_reference[lp]``: its
    text is that reference and its ``ref``/``refs`` the other references; rows are dropped
    (and counted in the log) when that reference file is absent or no other reference exists.
    """
    root = Path(root)
    drop_systems = dict(drop_systems or {})
    human_reference = DEFAULT_HUMAN_REFERENCE if human_reference is None else dict(human_reference)
    humaneval = root / WMT_REPO / "humaneval" / "newstest2021-toen"
    rows: list[dict] = []
    for lp in _check_lps(lps, WMT21_DA_LPS, "wmt21_da"):
        text = Newstest2021(root, lp, pseudo_doc_size)
        score_path = _require_file(humaneval / f"ad-seg-scores-{lp}.csv", "DA score file")
        name = str(score_path)
        df = _read_table(score_path, sep=r"\s+")
        require_columns(df, ("SYS", "SID", "RAW.SCR", "Z.SCR", "N"), name)
        sids = _positive_ints(df, "SID", name)
        raw = numeric_column(df, "RAW.SCR", name).to_numpy()
        z = numeric_column(df, "Z.SCR", name).to_numpy()
        check_range(z, SCORE_RANGES["wmt21_da"], name, "Z.SCR", "DA z-score")
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
            reason = _dropped_reason(system, drop_systems)
            if reason is not None:
                drops[f"system {system} ({reason})"] = drops.get(f"system {system} ({reason})", 0) + 1
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
                    key = f"HUMAN = reference {letter}, whose text is not in the data"
                    drops[key] = drops.get(key, 0) + 1
                    continue
                if not others:
                    key = f"HUMAN = reference {letter}, and no other reference to score it against"
                    drops[key] = drops.get(key, 0) + 1
                    continue
                mt = _seg_line(
                    text.refs[letter], sid, text.ref_files[letter], name, line, f"reference {letter}"
                )
                system_name = f"HUMAN-ref{letter}"
            else:
                others = letters
                mt = _system_output(text, system, sys_id, sid, name, line, "wmt21_da", drop_empty_mt, drops)
                if mt is None:
                    continue
                system_name = system
            src = _seg_line(text.source, sid, text.source_file, name, line, "source")
            refs = [
                _seg_line(text.refs[x], sid, text.ref_files[x], name, line, f"reference {x}") for x in others
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
                    n_annotators=n_ann[i],
                    doc=text.doc(sid),
                    system=system_name,
                    seg_id=sid,
                    domain="news",
                    year=2021,
                )
            )
        _log_drops("wmt21_da", lp, drops)
    return _frame(rows)


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
    check_range(df["score"], SCORE_RANGES["wmt21_mqm"], name, "mqm_avg_score", "MQM score", rows=lines)
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


def load_wmt21_mqm(
    root: str | Path,
    lps: Iterable[str] = WMT21_MQM_LPS,
    *,
    pseudo_doc_size: int = 10,
    drop_systems: Mapping[str, str] | None = None,
    drop_empty_mt: bool = False,
) -> pd.DataFrame:
    """newstest2021 expert MQM (en-de, zh-en) joined on ``seg_id`` with the WMT21 text.

    ``score`` = ``score_raw`` = MQM as published (0 best, negative worse).  Rated human
    references (``ref-X``) are kept as rows with ``system = "ref-X"`` when their text is in the
    data; their ``ref`` is the first *other* reference in alphabetical order and ``refs`` all
    other references; without text or without another reference they are dropped (logged).
    """
    root = Path(root)
    drop_systems = DEFAULT_DROP_SYSTEMS["wmt21_mqm"] if drop_systems is None else dict(drop_systems)
    rows: list[dict] = []
    for lp in _check_lps(lps, WMT21_MQM_LPS, "wmt21_mqm"):
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
        drops: dict[str, int] = {}
        for i, (system, sid, score) in enumerate(zip(df["system"], df["seg_id"], df["score"], strict=True)):
            line = int(lines[i])
            sid = int(sid)
            reason = _dropped_reason(system, drop_systems)
            if reason is not None:
                key = f"system {system} ({reason})"
                drops[key] = drops.get(key, 0) + 1
                continue
            match = _REF_SYSTEM.match(system)
            ref_texts = {
                x: _seg_line(text.refs[x], sid, text.ref_files[x], name, line, f"reference {x}")
                for x in text.refs
            }
            if match:
                letter = match.group(1)
                if letter not in text.refs:
                    key = f"rated reference {system}: its text is not in the data"
                    drops[key] = drops.get(key, 0) + 1
                    continue
                refs = _other_refs(letter, ref_texts)
                if not refs:
                    key = f"rated reference {system}: no other reference"
                    drops[key] = drops.get(key, 0) + 1
                    continue
                mt = ref_texts[letter]
            else:
                file_system = SYSTEM_ALIASES.get(system, system)
                mt = _system_output(
                    text, file_system, system, sid, name, line, "wmt21_mqm", drop_empty_mt, drops
                )
                if mt is None:
                    continue
                refs = [ref_texts[x] for x in sorted(ref_texts)]
                system = file_system
            src = _seg_line(text.source, sid, text.source_file, name, line, "source")
            rows.append(
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


def load_ted_mqm(
    root: str | Path, lps: Iterable[str] = TED_MQM_LPS, *, drop_systems: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """WMT21 TED-talk expert MQM (out-of-domain), text from ``mqm_ted_<lp>.tsv``.

    Reference of a segment = target of the system ``ref`` (= ``ref-A`` in the score file), and
    for zh-en also ``refB`` (= ``ref-B``).  The references' own rated rows follow the newstest
    rule: kept with ``ref`` = the other reference (zh-en), dropped where there is none (en-de).
    Metric-selected systems (``metricsystem*``) have text here and are kept.
    """
    root = Path(root)
    drop_systems = dict(drop_systems or {})
    rows: list[dict] = []
    for lp in _check_lps(lps, TED_MQM_LPS, "ted_mqm"):
        src_lang, _ = _lp_parts(lp)
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
            reason = _dropped_reason(system, drop_systems)
            if reason is not None:
                key = f"system {system} ({reason})"
                drops[key] = drops.get(key, 0) + 1
                continue
            if (system, sid) not in texts:
                raise DataError(
                    f"{name}: line {lines[i]}: unknown system {system!r} or segment {sid}: no text for it in "
                    f"{text_path}; list it in prepare.drop_systems.ted_mqm with a reason to skip it"
                )
            src, mt, doc, _ = texts[(system, sid)]
            ref_texts = {r: texts[(r, sid)][1] for r in ref_names if (r, sid) in texts}
            if _REF_SYSTEM.match(system):
                refs = _other_refs(system, ref_texts)
                if not refs:
                    key = f"rated reference {system}: no other reference"
                    drops[key] = drops.get(key, 0) + 1
                    continue
            else:
                refs = [ref_texts[r] for r in sorted(ref_texts)]
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
            check_range(z_mean, SCORE_RANGES["mlqe"], name, "z_mean", "DA z-score")
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
        check_range(scores, SCORE_RANGES["qt21_hter"], name, "score", "HTER")
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
    check_range(scores, SCORE_RANGES["multihyp_eten"], score_name, "DA-z", "DA z-score", first_line=1)
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


LOADERS = {
    "wmt21_da": load_wmt21_da,
    "wmt21_mqm": load_wmt21_mqm,
    "ted_mqm": load_ted_mqm,
    "mlqe": load_mlqe,
    "qt21_hter": load_qt21_hter,
    "multihyp_eten": load_multihyp_eten,
}
