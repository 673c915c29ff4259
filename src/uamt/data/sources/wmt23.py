"""WMT23 general-task expert MQM (en-de, he-en, zh-en) and its side-by-side re-rating (en-de, zh-en).

Two datasets, both on the MQM scale (``score`` 0 = no error, negative = weighted error penalty,
``score_raw`` = ``score``), both keyed on the WMT23 test set as published in the mt-metrics-eval
layout of ``wmt-conference/ErrorSpanAnnotation`` (``data/mt-metrics-eval-v2/wmt23``), so the same
segment has the same ``doc`` (``wmt23/<source language>/<doc id>``), ``seg_id`` (1-based line of
``sources/<lp>.txt``) and ``src`` (that line, verbatim) in both:

``wmt23_mqm`` (:func:`load_wmt23_mqm`)
    ``human-scores/<lp>.mqm.seg.score`` joined line by line with the WMT23 text.  One row per
    rated (system, segment).  en-de segments are **paragraphs** (about 350 characters), and no
    WMT23 language pair caps the penalty at -25: en-de reaches -138, zh-en -72, he-en -45
    (hence :data:`WMT23_MQM_RANGE`).  zh-en has per-rater ratings
    (``<lp>.mqm.rater<k>.seg.rating``, JSON error lists): ``annotator_scores`` holds one score
    per rater who rated the item (288 items have all 8 raters, the rest one), and ``seg.score``
    is exactly their mean (checked on load).  Other LPs publish one score per item:
    ``annotator_scores = [score]``.

``wmt23_sxs_mqm`` (:func:`load_wmt23_sxs_mqm`)
    Google's side-by-side MQM re-rating (``google/wmt-mqm-human-evaluation``, ``generalMT2023``):
    3 raters per (system, segment) item, scored here with :func:`uamt.data.mqm.mqm_score` per
    rater and averaged; ``annotator_scores`` = the 3 per-rater scores.  Items are mapped to the
    WMT23 line through ``doc`` + ``docSegId`` (the ``docSegId``-th line of that document in
    ``documents/<lp>.docs``), verified against the source text (every item of both LPs maps).
    ``src`` is the WMT23 line, not the side-by-side copy, which differs in spacing (zh-en: 62 of
    377 segments); ``mt`` is the rated side-by-side target (marks removed), which in a few items
    differs from ``system-outputs/`` in apostrophes (en-de 1 of 1,040, zh-en 42 of 3,770).
    Note the weights: :func:`~uamt.data.mqm.mqm_weight` counts ``Accuracy/Creative
    Reinterpretation`` as an ordinary Minor/Major error, while the publishers' own WMT23 MQM
    scores (``rater<k>.seg.rating``) weigh it 0; it occurs in 225 en-de and 49 zh-en items.
    The side-by-side item scores correlate with ``wmt23_mqm`` at Pearson 0.61 (en-de) and
    0.72 (zh-en): a re-rating, kept as a dataset of its own.

References are the human references of the LP (``references/<lp>.ref<X>.txt``: en-de and zh-en
have refA only, he-en refA and refB).  ``synthetic_ref`` is machine-made, never a reference: where
it is rated it is an ordinary system.  A rated human reference (system ``refX``) is kept with
``refs`` = the *other* human references and dropped (counted in the log) where there is none, so
rated refA rows of en-de and zh-en are dropped.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.data.loaders import (
    _SPAN_MARK,
    _check_lps,
    _dropped_reason,
    _frame,
    _log_drops,
    _lp_parts,
    _read_table,
    _require_file,
    _row,
    _tar_members,
    refs_of_row,
)
from uamt.data.mqm import mqm_score, mqm_weight
from uamt.data.schema import check_range, check_text, decode_lines, read_lines, require_columns

log = logging.getLogger(__name__)

ESA_REPO = "wmt-conference/ErrorSpanAnnotation"
MQM_REPO = "google/wmt-mqm-human-evaluation"
#: The WMT23 folder of the mt-metrics-eval layout, relative to the data root.
WMT23_DIR = Path(ESA_REPO) / "data" / "mt-metrics-eval-v2" / "wmt23"

WMT23_MQM_LPS = ("en-de", "he-en", "zh-en")
WMT23_SXS_LPS = ("en-de", "zh-en")
#: Plausible ``score`` range of both WMT23 datasets (MQM, inclusive).  WMT23 does not cap a
#: segment's penalty at -25 (en-de paragraphs reach -138, zh-en sentences -72, he-en -45; the
#: side-by-side items reach -45 averaged, -72 for one rater), so the floor is well below the
#: observed minimum; the ceiling 0 still catches a sign-flipped or 0-100 column.
WMT23_MQM_RANGE = (-200.0, 0.0)
WMT23_SXS_RANGE = WMT23_MQM_RANGE
WMT23_YEAR = 2023

#: The side-by-side TSV columns this loader reads (the header has an 11th, comment field).
SXS_COLUMNS = (
    "system",
    "doc",
    "docSegId",
    "globalSegId",
    "rater",
    "source",
    "target",
    "category",
    "severity",
    "metadata",
)
#: Severity of the side-by-side attention checks (an error planted in the target; "Found"/"Missed").
HOTW_SEVERITY = "HOTW-test"
_HUMAN_REF_FILE = re.compile(r"^(?P<lp>[a-z]+-[a-z]+)\.ref(?P<letter>[A-Z])\.txt$")
_HUMAN_REF_SYSTEM = re.compile(r"^ref([A-Z])$")
_RATER_FILE = re.compile(r"\.mqm\.rater(\d+)\.seg\.rating$")
_UNRATED = "None"


# ----------------------------------------------------------------------------- shared text


def _text_key(text: str) -> str:
    """Compare key for the same sentence in two releases: NFKC, case-folded, **no** whitespace.

    The side-by-side sources differ from ``sources/<lp>.txt`` only in spacing (zh-en: 62 of 377,
    e.g. ``记者 牛瑞飞`` vs ``记者牛瑞飞``), which :func:`uamt.data.schema.normalise_source` keeps.
    """
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text)).casefold()


class Wmt23Text:
    """The WMT23 text of one language pair: source, human references, system outputs, documents.

    Every file is line-aligned with ``sources/<lp>.txt`` (line i = segment i); a file of another
    length raises :class:`DataError`.
    """

    def __init__(self, root: Path, lp: str):
        self.lp = lp
        self.src_lang, self.tgt_lang = _lp_parts(lp)
        self.dir = Path(root) / WMT23_DIR
        self.source_file = _require_file(self.dir / "sources" / f"{lp}.txt", "WMT23 source file")
        self.source = read_lines(self.source_file)
        if not self.source:
            raise DataError(f"{self.source_file}: WMT23 source file is empty")
        self.ref_files: dict[str, Path] = {}
        for path in sorted((self.dir / "references").glob(f"{lp}.ref*.txt")):
            # refA, refB, ... are human translations; synthetic_ref (no match) is machine output.
            match = _HUMAN_REF_FILE.match(path.name)
            if match and match.group("lp") == lp:
                self.ref_files[match.group("letter")] = path
        self.refs = {x: self._aligned(path, "reference") for x, path in self.ref_files.items()}
        self.docs_file = _require_file(self.dir / "documents" / f"{lp}.docs", "WMT23 documents file")
        self.domains: list[str] = []
        self.doc_ids: list[str] = []
        for i, line in enumerate(self._aligned(self.docs_file, "documents")):
            parts = line.split("\t")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise DataError(f"{self.docs_file}: line {i + 1}: expected 'domain<TAB>doc', got {line!r}")
            self.domains.append(parts[0])
            self.doc_ids.append(parts[1])
        self._hyps: dict[str, list[str]] = {}

    def _aligned(self, path: Path, what: str) -> list[str]:
        lines = read_lines(path)
        if len(lines) != len(self.source):
            raise DataError(
                f"{path}: {len(lines)} lines, but the source file {self.source_file} has "
                f"{len(self.source)}: {what} files must be line-aligned with the source"
            )
        return lines

    def hyp_file(self, system: str) -> Path:
        return self.dir / "system-outputs" / self.lp / f"{system}.txt"

    def hyp(self, system: str) -> list[str]:
        if system not in self._hyps:
            self._hyps[system] = self._aligned(self.hyp_file(system), f"system {system} output")
        return self._hyps[system]

    def src(self, seg: int) -> str:
        return check_text(self.source[seg - 1], str(self.source_file), seg, "source")

    def ref_texts(self, seg: int) -> dict[str, str]:
        """Human reference letter -> text of segment ``seg`` (1-based)."""
        return {
            x: check_text(lines[seg - 1], str(self.ref_files[x]), seg, f"reference {x}")
            for x, lines in self.refs.items()
        }

    def doc(self, seg: int) -> str:
        return f"wmt23/{self.src_lang}/{self.doc_ids[seg - 1]}"

    def domain(self, seg: int) -> str:
        return self.domains[seg - 1]

    def row(
        self, dataset: str, seg: int, system: str, mt: str, refs: list[str], score: float, raters: list[float]
    ) -> dict:
        """One canonical row for segment ``seg`` (source, document and domain from this test set)."""
        return _row(
            dataset=dataset,
            lp=self.lp,
            src=self.src(seg),
            mt=mt,
            refs=refs,
            score=score,
            score_raw=score,
            annotator_scores=raters,
            n_annotators=len(raters),
            doc=self.doc(seg),
            system=system,
            seg_id=seg,
            domain=self.domain(seg),
            year=WMT23_YEAR,
        )

    def doc_lines(self) -> dict[str, list[int]]:
        """``<domain>_<doc>`` (the side-by-side files' document name) -> its 1-based lines, in order."""
        out: dict[str, list[int]] = {}
        for i, (domain, doc) in enumerate(zip(self.domains, self.doc_ids, strict=True)):
            out.setdefault(f"{domain}_{doc}", []).append(i + 1)
        return out


# ----------------------------------------------------------------------------- WMT23 MQM


def _read_blocks(path: Path, n_seg: int, source_file: Path) -> dict[str, tuple[list[str], int]]:
    """system -> (its ``n_seg`` values in segment order, file line of its first value).

    mt-metrics-eval files hold ``system<TAB>value`` lines, one block of ``n_seg`` lines per
    system (line i of a block = segment i).  A block of another length shifts every later
    score onto the wrong segment, so it is refused, naming the line where the block breaks.
    """
    lines = read_lines(path)
    if not lines or len(lines) % n_seg:
        raise DataError(
            f"{path}: {len(lines)} lines is not a multiple of the {n_seg} lines of {source_file}: "
            "each system needs one block with one line per source segment"
        )
    blocks: dict[str, tuple[list[str], int]] = {}
    for start in range(0, len(lines), n_seg):
        system = None
        values: list[str] = []
        for i in range(start, start + n_seg):
            parts = lines[i].split("\t")
            if len(parts) != 2 or not parts[0].strip():
                raise DataError(f"{path}: line {i + 1}: expected 'system<TAB>value', got {lines[i]!r}")
            if system is None:
                system = parts[0]
            elif parts[0] != system:
                raise DataError(
                    f"{path}: line {i + 1}: system {parts[0]!r} inside the block of {system!r} (lines "
                    f"{start + 1}-{start + n_seg}): every block must be {n_seg} lines long, one per line "
                    f"of {source_file}"
                )
            values.append(parts[1])
        assert system is not None
        if system in blocks:
            raise DataError(
                f"{path}: line {start + 1}: second block of system {system!r} (first at line "
                f"{blocks[system][1]}); keep one block per system"
            )
        blocks[system] = (values, start + 1)
    return blocks


def _parse_score(value: str, path: Path, line: int) -> float | None:
    """A seg.score value as float, None for ``None`` (not rated)."""
    if value == _UNRATED:
        return None
    try:
        score = float(value)
    except ValueError:
        score = math.nan
    if not math.isfinite(score):
        raise DataError(f"{path}: line {line}: score must be a finite number or None, got {value!r}")
    return score + 0.0  # the files write a clean segment as -0.0: store 0.0


def _rating_score(value: str, path: Path, line: int) -> float | None:
    """One rater's score from a ``rater<k>.seg.rating`` JSON rating: -(sum of its errors' ``score``).

    The per-error ``score`` is the weight the publishers applied; it is used rather than
    :func:`mqm_weight` because it reproduces ``seg.score`` exactly (the publishers weigh
    ``accuracy/creative reinterpretation`` 0, :func:`mqm_weight` 1 or 5).
    """
    if value == _UNRATED:
        return None
    try:
        errors = json.loads(value)["errors"]
        weights = [float(e["score"]) for e in errors]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f'{path}: line {line}: expected a JSON rating {{"errors": [{{"score": ...}}, ...]}} or None, '
            f"got {value[:80]!r} ({exc})"
        ) from exc
    if not all(math.isfinite(w) for w in weights):
        raise DataError(f"{path}: line {line}: error scores must be finite numbers, got {weights}")
    return -sum(weights) + 0.0  # + 0.0: no error is 0.0, not -0.0


def _rater_scores(
    text: Wmt23Text, n_seg: int
) -> tuple[dict[tuple[str, int], list[float]], dict[tuple[str, int], str]]:
    """(system, seg) -> per-rater scores (rater-number order), and -> the files that rated it.

    Empty for language pairs without ``<lp>.mqm.rater<k>.seg.rating`` files (en-de, he-en).
    """
    scores: dict[tuple[str, int], list[float]] = {}
    where: dict[tuple[str, int], str] = {}
    files = sorted(
        (int(m.group(1)), p)
        for p in (text.dir / "human-scores").glob(f"{text.lp}.mqm.rater*.seg.rating")
        if (m := _RATER_FILE.search(p.name))
    )
    for _, path in files:
        for system, (values, first) in _read_blocks(path, n_seg, text.source_file).items():
            for i, value in enumerate(values):
                score = _rating_score(value, path, first + i)
                if score is not None:
                    scores.setdefault((system, i + 1), []).append(score)
                    where.setdefault((system, i + 1), f"{path}: line {first + i}")
    return scores, where


def load_wmt23_mqm(
    root: str | Path,
    lps: Iterable[str] = WMT23_MQM_LPS,
    *,
    drop_systems: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """WMT23 general-task expert MQM (en-de paragraphs, he-en, zh-en) joined with the WMT23 text.

    Parameters
    ----------
    root
        Data root laid out ``<owner>/<repo>/<path>``; reads ``wmt-conference/ErrorSpanAnnotation/
        data/mt-metrics-eval-v2/wmt23/``.
    lps
        Language pairs, a subset of :data:`WMT23_MQM_LPS`.
    drop_systems
        ``{fnmatch pattern: reason}`` of systems to skip (counted in the log); a rated system
        with no text file must be listed here (``prepare.drop_systems.wmt23_mqm``).

    Returns
    -------
    pandas.DataFrame
        The canonical table, one row per rated (system, segment) of ``<lp>.mqm.seg.score``
        (``None`` = not rated, skipped).  ``score`` = ``score_raw`` = the published MQM score
        (0 best, negative worse, within :data:`WMT23_MQM_RANGE`; already the negated penalty).
        ``annotator_scores``: zh-en, the scores of the raters who rated the item (from
        ``rater<k>.seg.rating``, whose mean is ``score``: 8 for 288 items, 1 otherwise);
        other LPs ``[score]``.  ``n_annotators`` = ``len(annotator_scores)``.  ``seg_id`` =
        1-based line, ``doc`` = ``wmt23/<src lang>/<doc>``, ``domain`` from
        ``documents/<lp>.docs``, ``year`` 2023.  Rated human references are kept with ``refs`` =
        the other human references or dropped when there is none (en-de and zh-en refA).

    Raises
    ------
    DataError
        Naming the file and line: a missing file, a text file not line-aligned with the source,
        a score-file block that is not one line per source segment, a non-numeric or
        out-of-range score, an empty source/output/reference of a rated segment, a per-rater
        mean that differs from ``seg.score``, or a system without a text file.
    """
    root = Path(root)
    drop_systems = dict(drop_systems or {})
    rows: list[dict] = []
    for lp in _check_lps(lps, WMT23_MQM_LPS, "wmt23_mqm"):
        text = Wmt23Text(root, lp)
        n_seg = len(text.source)
        path = _require_file(text.dir / "human-scores" / f"{lp}.mqm.seg.score", "WMT23 MQM score file")
        per_rater, rater_line = _rater_scores(text, n_seg)
        drops: dict[str, int] = {}
        without_raters = 0
        for system, (values, first) in _read_blocks(path, n_seg, text.source_file).items():
            parsed = [_parse_score(v, path, first + i) for i, v in enumerate(values)]
            rated = [i for i, s in enumerate(parsed) if s is not None]
            check_range(
                [parsed[i] for i in rated],
                WMT23_MQM_RANGE,
                str(path),
                "score",
                "WMT23 MQM score",
                rows=np.array(rated, dtype=int) + first,
            )
            reason = _dropped_reason(system, drop_systems)
            if reason is not None:
                drops[f"system {system} ({reason})"] = len(rated)
                continue
            ref_match = _HUMAN_REF_SYSTEM.match(system)
            is_human_ref = bool(ref_match) and ref_match.group(1) in text.refs
            if not is_human_ref and rated and not text.hyp_file(system).is_file():
                raise DataError(
                    f"{path}: line {first + rated[0]}: unknown system {system!r}: no text file "
                    f"{text.hyp_file(system)}; list it in prepare.drop_systems.wmt23_mqm with a reason "
                    "to skip it"
                )
            for i in rated:
                seg, line, score = i + 1, first + i, parsed[i]
                assert score is not None
                refs_all = text.ref_texts(seg)
                letter = ref_match.group(1) if is_human_ref else None  # type: ignore[union-attr]
                refs = refs_of_row(letter, refs_all)
                if refs is None:
                    key = f"rated reference {system}: no other human reference (synthetic_ref is MT)"
                    drops[key] = drops.get(key, 0) + 1
                    continue
                if is_human_ref:
                    mt = refs_all[letter]
                else:
                    mt = check_text(
                        text.hyp(system)[i], str(text.hyp_file(system)), seg, f"system {system} output"
                    )
                raters = per_rater.get((system, seg))
                if raters is not None and not math.isclose(
                    float(np.mean(raters)), score, rel_tol=0.0, abs_tol=1e-6
                ):
                    raise DataError(
                        f"{path}: line {line}: score {score:g} of ({system!r}, segment {seg}) is not the mean "
                        f"{float(np.mean(raters)):g} of its per-rater ratings {raters} (first at "
                        f"{rater_line[(system, seg)]}): are the rater files from another release?"
                    )
                if raters is None:
                    # no per-rater file, or (3 zh-en refA items) no rater kept a rating: one score
                    without_raters += bool(per_rater)
                    raters = [score]
                rows.append(text.row("wmt23_mqm", seg, system, mt, refs, score, raters))
        _log_drops("wmt23_mqm", lp, drops)
        if without_raters:
            log.info(
                "wmt23_mqm %s: %d rated rows have no per-rater rating; annotator_scores = [score]",
                lp,
                without_raters,
            )
    return _frame(rows)


# ----------------------------------------------------------------------------- WMT23 side-by-side


def _sxs_table(tar_path: Path) -> tuple[pd.DataFrame, str]:
    """The 10 data columns of the one TSV inside ``tar_path`` (read in memory), and its name."""
    members = {k: v for k, v in _tar_members(tar_path).items() if k.endswith(".tsv")}
    if len(members) != 1:
        raise DataError(f"{tar_path}: expected one .tsv member, found {sorted(members)}")
    member, data = next(iter(members.items()))
    name = f"{tar_path}:{member}"
    # pandas pads a short row with "" (no NA conversion), so count the fields on the raw lines.
    for i, line in enumerate(decode_lines(data, name)[1:]):
        if line.count("\t") + 1 < len(SXS_COLUMNS):
            raise DataError(f"{name}: line {i + 2}: fewer than the {len(SXS_COLUMNS)} tab-separated fields")
    # No quoting: targets hold bare quotes; the header's 11th field is a comment with no data.
    df = _read_table(Path(name), sep="\t", name=name, data=data)
    require_columns(df, SXS_COLUMNS, name)
    return df[list(SXS_COLUMNS)], name


def _seg_number(value: str, name: str, line: int) -> int:
    if not value.isdigit() or int(value) < 1:
        raise DataError(f"{name}: line {line}: 'docSegId' must be a positive integer, got {value!r}")
    return int(value)


def load_wmt23_sxs_mqm(root: str | Path, lps: Iterable[str] = WMT23_SXS_LPS) -> pd.DataFrame:
    """WMT23 side-by-side MQM (Google, 3 raters per item, en-de paragraphs and zh-en), on WMT23 keys.

    Parameters
    ----------
    root
        Data root laid out ``<owner>/<repo>/<path>``; reads ``google/wmt-mqm-human-evaluation/
        generalMT2023/<ende|zhen>/sxs_mqm_generalMT2023_*.3ratingsPerSegment.tsv.tar.gz`` and the
        WMT23 text of :func:`load_wmt23_mqm`.
    lps
        Language pairs, a subset of :data:`WMT23_SXS_LPS`.

    Returns
    -------
    pandas.DataFrame
        The canonical table, one row per (system, segment) item.  Attention-check rows
        (``severity == HOTW-test``) are dropped.  Per rater, score = :func:`mqm_score` of that
        rater's error rows (``No-error`` = 0; MQM, 0 best, negative worse); ``score`` =
        ``score_raw`` = mean over raters (within :data:`WMT23_SXS_RANGE`),
        ``annotator_scores`` = the per-rater scores (rater first-appearance order),
        ``n_annotators`` = their number (3).  ``seg_id``, ``doc``, ``src`` and ``domain`` are
        those of the WMT23 line (identical to ``wmt23_mqm``); ``mt`` = the rated target with
        its ``<v>`` span marks removed; ``refs`` = the WMT23 human references of the line.
        ``system`` is as in the file (en-de ``GPT4-5shot_with_ONLINE-W`` and
        ``GPT4-5shot_with_refA`` are GPT4-5shot rated beside two different systems).  System
        ``refA`` (en-de) has no other human reference and is dropped (logged).
        ``df.attrs["sxs_mapping"]`` = ``{lp: {"doc": n, "source_text": n, "unmatched": n}}``:
        how each item found its WMT23 line (unmatched items are dropped, logged as a warning).

    Raises
    ------
    DataError
        Naming the file and line: a missing file, missing/renamed columns, a short row, a
        non-integer ``docSegId``, an unknown severity, empty text, rows of one item whose
        targets differ beyond spacing, a document of another language pair, an out-of-range
        score.
    """
    root = Path(root)
    rows: list[dict] = []
    mapping: dict[str, dict[str, int]] = {}
    for lp in _check_lps(lps, WMT23_SXS_LPS, "wmt23_sxs_mqm"):
        code = lp.replace("-", "")
        tar_path = _require_file(
            root
            / MQM_REPO
            / "generalMT2023"
            / code
            / f"sxs_mqm_generalMT2023_{code}.3ratingsPerSegment.tsv.tar.gz",
            "WMT23 side-by-side MQM tarball",
        )
        text = Wmt23Text(root, lp)
        df, name = _sxs_table(tar_path)
        doc_lines = text.doc_lines()
        by_source: dict[str, list[int]] = {}
        for i, line in enumerate(text.source):
            by_source.setdefault(_text_key(line), []).append(i + 1)

        # Items in file order: (system, doc, docSegId) -> first line, source, targets, rater -> errors.
        items: dict[tuple[str, str, int], dict] = {}
        drops: dict[str, int] = {}
        cols = [df[c].tolist() for c in ("system", "doc", "docSegId", "rater", "source", "target")]
        for i, (system, doc, seg_text, rater, source, target, category, severity) in enumerate(
            zip(*cols, df["category"], df["severity"], strict=True)
        ):
            line = i + 2
            if severity == HOTW_SEVERITY:
                # Attention check: an error planted in the target ("Found"/"Missed"), not a rating.
                drops["HOTW-test attention-check rows"] = drops.get("HOTW-test attention-check rows", 0) + 1
                continue
            check_text(system, name, line, "system")
            check_text(rater, name, line, "rater")
            check_text(doc, name, line, "doc")
            try:
                mqm_weight(severity, category)  # validate here so the error names the line
            except DataError as exc:
                raise DataError(f"{name}: line {line}: {exc}") from exc
            key = (system, doc, _seg_number(seg_text, name, line))
            item = items.get(key)
            if item is None:
                src = check_text(_SPAN_MARK.sub("", source), name, line, "source")
                item = items[key] = {"line": line, "source": src, "targets": [], "raters": {}}
            mt = check_text(_SPAN_MARK.sub("", target), name, line, "target")
            if _text_key(mt) != _text_key(item["targets"][0][0] if item["targets"] else mt):
                raise DataError(
                    f"{name}: line {line}: target of ({system!r}, {doc!r}, docSegId {key[2]}) differs from "
                    f"the one on line {item['targets'][0][1]} beyond spacing and span marks"
                )
            item["targets"].append((mt, line))
            item["raters"].setdefault(rater, []).append((severity, category))

        counts = {"doc": 0, "source_text": 0, "unmatched": 0}
        for (system, doc, seg_in_doc), item in items.items():
            line = item["line"]
            doc_name, _, doc_lp = doc.rpartition(":")
            if not doc_name:
                doc_name, doc_lp = doc, lp
            if doc_lp != lp:
                raise DataError(f"{name}: line {line}: document {doc!r} belongs to {doc_lp}, not {lp}")
            # doc + docSegId is the key; the source text confirms it (and rescues a renamed doc).
            in_doc = doc_lines.get(doc_name, [])
            seg = in_doc[seg_in_doc - 1] if seg_in_doc <= len(in_doc) else None
            if seg is not None and _text_key(text.source[seg - 1]) == _text_key(item["source"]):
                counts["doc"] += 1
            else:
                candidates = by_source.get(_text_key(item["source"]), [])
                if len(candidates) != 1:
                    counts["unmatched"] += 1
                    continue
                seg = candidates[0]
                counts["source_text"] += 1
            refs_all = text.ref_texts(seg)
            ref_match = _HUMAN_REF_SYSTEM.match(system)
            own = ref_match.group(1) if ref_match and ref_match.group(1) in refs_all else None
            refs = refs_of_row(own, refs_all)
            if refs is None:
                key = f"rated reference {system}: no other human reference (synthetic_ref is MT)"
                drops[key] = drops.get(key, 0) + 1
                continue
            per_rater = [mqm_score(errors) + 0.0 for errors in item["raters"].values()]  # no -0.0
            score = float(np.mean(per_rater))
            check_range([score], WMT23_SXS_RANGE, name, "severity/category", "MQM score", rows=[line])
            # Raters' copies differ only in spacing around their span marks: take the commonest.
            mt = collections.Counter(t for t, _ in item["targets"]).most_common(1)[0][0]
            rows.append(text.row("wmt23_sxs_mqm", seg, system, mt, refs, score, per_rater))
        mapping[lp] = counts
        _log_drops("wmt23_sxs_mqm", lp, drops)
        log.info(
            "wmt23_sxs_mqm %s: %d items mapped to WMT23 lines by doc+docSegId, %d by source text",
            lp,
            counts["doc"],
            counts["source_text"],
        )
        if counts["unmatched"]:
            log.warning(
                "wmt23_sxs_mqm %s: dropped %d items whose source is not a WMT23 segment of their document "
                "nor a unique WMT23 source line",
                lp,
                counts["unmatched"],
            )
    out = _frame(rows)
    out.attrs["sxs_mapping"] = mapping
    return out
