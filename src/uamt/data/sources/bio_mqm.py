"""Biomedical MQM (Zouhar et al. 2024, *Fine-Tuned Machine Translation Metrics Struggle in Unseen Domains*).

Expert MQM annotations of WMT21 biomedical-task outputs (MEDLINE abstracts) and of two new human
references, in 15 directions (de/es/fr/it/pt/ru/zh <-> en, en -> eu).  The pipeline uses the whole
set as out-of-domain evaluation; :func:`bio_doc_splits` gives the authors' dev/test documents for
later domain calibration.

Files read (under ``<root>/amazon-science/bio-mqm-dataset/``)
--------------------------------------------------------------
``data/v2/target/main_phase/round_two/<xx2yy>/<engine>.json``
    One file per rated engine: a JSON list of annotations ``{source, target, SEG_ID, DOC_ID,
    MT_Engine, target_errors, source_errors, Annotator_ID, ...}``.  The LP code of folder
    ``de2en`` is ``de-en``.  Engines ``reference`` and ``reference_r1`` are the two human
    references, themselves rated.
``data/doc_id_splits.json``
    The authors' dev/test documents (:func:`bio_doc_splits`).

Scores (the MQM scale of :mod:`uamt.data.mqm`: 0 = no error, negative = worse)
------------------------------------------------------------------------------
One annotator's score is ``-sum(mqm_weight(severity, category))`` over the errors marked in the
target **and** in the source: omissions are marked on the source words left out
(``Accuracy/Omission``) and are translation errors; errors of category ``Source`` (problems
of the source text itself) weigh 0.  Neutral weighs 0, Critical counts as Major (5).  The
taxonomy here is MQM-DQF, in which *Linguistic conventions* is the older *Fluency*, so
``Linguistic_conventions/Punctuation`` is scored as Google's ``Fluency/Punctuation`` (Minor =
0.1; :data:`BIO_MQM_CATEGORY_ALIASES`).  There is no ``Non-translation`` category and no cap on
the number of errors, so scores go below the -25 of Google's files (lowest: -70).

``score`` = ``score_raw`` = the mean over the item's annotators, ``annotator_scores`` = their
scores in file order, ``n_annotators`` = how many (1, or 2 for about 5.1k of the 50.6k rows).

Misaligned annotations (why rows are dropped)
---------------------------------------------
In de-en, en-de, en-es, en-pt, en-zh and zh-en some annotations carry the source *and* target
text of another, earlier segment of the same document and engine file, while ``SEG_ID`` and the
marked errors belong to the real segment (their character spans do not fit the text shown, and
the real segment's text is missing from the file).  The loader drops (and counts in the log and
in ``df.attrs["dropped"]``):

1. an annotation whose (document, source, target) occurs in the same engine file under a lower
   ``SEG_ID`` (the copy; the lowest ``SEG_ID`` is where the text belongs);
2. an annotation whose source differs from the source most engines give for its
   (``DOC_ID``, ``SEG_ID``), counting each engine once (after step 1); where two sources tie,
   every annotation of that segment (the segment cannot be told).

About 3.4k of 60k annotations go.  Of the dropped ones that mark errors, 98 % have an error
span whose ``term`` is not at its offsets in the text shown and 57 % one whose ``term`` is
nowhere in it (kept ones: 7 % and 0.4 %); sentence chrF vs MQM on de-en system rows rises from
r = 0.23 without the filter to 0.36.  What remains has one source text per (``DOC_ID``,
``SEG_ID``) across engines, so references join on (``DOC_ID``, ``SEG_ID``).

Rows
----
One per (direction, engine, ``DOC_ID``, ``SEG_ID``).  ``refs``: for a system, the texts of
``reference`` and ``reference_r1`` for that segment (those present, ``reference`` first); for a
rated reference, the other reference.  Rows without any such reference are dropped (counted).
``system`` = ``MT_Engine`` (checked equal to the file name).  ``doc`` =
:func:`bio_doc_key` ``bio/<src>/<lp>.<DOC_ID>``: ``DOC_ID`` numbers documents per direction
(en-de ``doc1`` and en-es ``doc1`` are different abstracts), so the direction is part of the key.
``seg_id`` = ``document number * 10000 + SEG_ID`` (``doc59`` segment 2 -> 590002): ``SEG_ID``
counts segments within a document (1, 2, ... with a few ids such as 400 or 1300 in en-fr/fr-en),
so this is unique per direction and does not depend on which rows are loaded.
``domain`` = ``"biomedical"``, ``year`` = 2021 (the WMT21 test sets and systems).

Caveat for reference-based use
------------------------------
The two references are not independent: ``reference_r1`` is a light revision of ``reference``
(identical in 49-92 % of segments; 11 % in zh-en), and both are close to the ``mtcarousel``
output (identical to ``reference`` in 25-60 % of its segments, 8 % in en-zh/zh-en; mean chrF
87-97 outside en-zh/zh-en), which looks like the draft they were post-edited from.
Reference-based metrics therefore favour ``mtcarousel``, a second reference adds little, and
sentence chrF tracks MQM weakly where every row is ``mtcarousel`` or a reference (all rows:
pt-en r = 0.07, en-eu 0.02; system rows elsewhere 0.15-0.39).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.core.errors import DataError
from uamt.data.loaders import (
    _check_lps,
    _dropped_reason,
    _frame,
    _log_drops,
    _lp_parts,
    _other_refs,
    _require_file,
    _row,
)
from uamt.data.mqm import mqm_score
from uamt.data.schema import check_range, check_text, decode_text

log = logging.getLogger(__name__)

DATASET = "bio_mqm"
BIO_MQM_REPO = "amazon-science/bio-mqm-dataset"
#: Folder (under the repository) of the per-direction engine files of the final annotations.
BIO_MQM_DIR = "data/v2/target/main_phase/round_two"
BIO_SPLITS_FILE = "data/doc_id_splits.json"
BIO_MQM_LPS = (
    "de-en",
    "en-de",
    "en-es",
    "en-eu",
    "en-fr",
    "en-it",
    "en-pt",
    "en-ru",
    "en-zh",
    "es-en",
    "fr-en",
    "it-en",
    "pt-en",
    "ru-en",
    "zh-en",
)
#: The engines that are human references (rated like systems, and the references of the others).
BIO_REFERENCE_ENGINES = ("reference", "reference_r1")
#: Plausible per-annotator (hence item) MQM scores: never positive; the lowest in the data is
#: -70 (14 Major errors), and with no cap on the number of errors -150 leaves room while still
#: catching a weight applied ten times over.
BIO_MQM_RANGE = (-150.0, 0.0)
#: ``seg_id = document number * BIO_SEG_ID_BASE + SEG_ID``; a SEG_ID at or above it is an error.
BIO_SEG_ID_BASE = 10_000
#: Direction names of ``doc_id_splits.json`` that differ from ours (Brazilian Portuguese).
BIO_SPLIT_LP_ALIASES = {"br-en": "pt-en"}
#: (category, subcategory), case-folded -> the category :func:`uamt.data.mqm.mqm_weight` knows.
#: MQM-DQF "Linguistic conventions" is MQM's "Fluency": its punctuation errors get the 0.1 Minor
#: weight Google's scheme gives ``Fluency/Punctuation``.  Every other category keeps its name
#: (none of them is special to ``mqm_weight``: Accuracy, Terminology, Style, Locale_conventions,
#: Linguistic_conventions, Unintelligible, Other; and ``Source``, which weighs 0).
BIO_MQM_CATEGORY_ALIASES = {("linguistic_conventions", "punctuation"): "Fluency/Punctuation"}

_REQUIRED_KEYS = ("source", "target", "SEG_ID", "DOC_ID", "MT_Engine", "target_errors", "Annotator_ID")
_DOC_ID = re.compile(r"doc([0-9]+)")
_JSON_SPACE = re.compile(r"[ \t\n\r]*")

COPIED_TEXT = (
    "annotations showing the text of an earlier segment of the same document and engine file "
    "(misaligned; their error spans do not fit that text)"
)
OTHER_SOURCE = (
    "annotations whose source differs from the other engines' source for that DOC_ID/SEG_ID (misaligned)"
)
TIED_SOURCE = "annotations of segments whose source text is tied between engines (cannot tell which is right)"
NO_REFERENCE = "system rows without any reference text for their segment"
NO_OTHER_REFERENCE = "rated reference rows without the other reference for their segment"


@dataclass(frozen=True)
class _Annotation:
    """One JSON item: one annotator's rating of one engine's translation of one segment."""

    line: int  # file line where the item starts (for messages)
    doc_id: str
    doc_number: int
    seg: int  # SEG_ID
    src: str
    mt: str
    annotator: str
    score: float  # on the MQM scale: 0 best, negative worse


def bio_doc_key(lp: str, doc_id: str) -> str:
    """The ``doc`` value of document ``doc_id`` (e.g. ``"doc59"``) of direction ``lp``.

    ``bio/<source language>/<lp>.<doc_id>``: the direction is in the key because ``DOC_ID``
    numbers the documents of each direction separately.
    """
    src_lang, _ = _lp_parts(lp)
    return f"bio/{src_lang}/{lp}.{doc_id}"


def _json_items(path: Path) -> list[tuple[int, object]]:
    """The items of the JSON list in ``path``, each with the file line where it starts.

    Decoded item by item with ``raw_decode`` (the C scanner, as fast as ``json.loads`` on the
    whole file) so that every later message can name a line.
    """
    name = str(path)
    text = decode_text(path.read_bytes(), name)
    decoder = json.JSONDecoder()
    pos = _JSON_SPACE.match(text).end()
    if text[pos : pos + 1] != "[":
        raise DataError(f"{name}: expected a JSON list of annotations, found {text[pos : pos + 20]!r}")
    pos = _JSON_SPACE.match(text, pos + 1).end()
    items: list[tuple[int, object]] = []
    line, counted = 1, 0
    if text[pos : pos + 1] == "]":
        pos += 1
    else:
        while True:
            try:
                item, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise DataError(f"{name}: line {exc.lineno}: not valid JSON: {exc.msg}") from exc
            line += text.count("\n", counted, pos)
            counted = pos
            items.append((line, item))
            pos = _JSON_SPACE.match(text, end).end()
            char = text[pos : pos + 1]
            if char == "]":
                pos += 1
                break
            if char != ",":
                at = line + text.count("\n", counted, pos)
                raise DataError(
                    f"{name}: line {at}: not valid JSON: expected ',' or ']' after item {len(items) - 1}"
                )
            pos = _JSON_SPACE.match(text, pos + 1).end()
    if text[pos:].strip():
        at = line + text.count("\n", counted, pos)
        raise DataError(f"{name}: line {at}: not valid JSON: extra data after the list")
    return items


def _errors(item: dict, key: str, name: str, where: str) -> list[tuple[str, str]]:
    """(severity, category) of each error in ``item[key]``, categories mapped by the aliases."""
    errors = item.get(key, [])
    if not isinstance(errors, list):
        raise DataError(f"{name}: line {where}: {key} must be a list, got {type(errors).__name__}")
    out = []
    for k, error in enumerate(errors):
        if not isinstance(error, dict):
            raise DataError(f"{name}: line {where}: {key}[{k}] must be an object, got {type(error).__name__}")
        severity, category = error.get("severity"), error.get("error_category")
        subcategory = error.get("error_subcategory") or ""
        if not isinstance(severity, str) or not isinstance(category, str) or not isinstance(subcategory, str):
            raise DataError(
                f"{name}: line {where}: {key}[{k}] needs string 'severity' and 'error_category', got "
                f"{severity!r} and {category!r}"
            )
        alias = BIO_MQM_CATEGORY_ALIASES.get((category.strip().casefold(), subcategory.strip().casefold()))
        out.append((severity, alias or category))
    return out


def _seg_number(value: object, name: str, where: str) -> int:
    # SEG_ID is a string of digits in the files; an int is accepted too (bool is not an id).
    if isinstance(value, str) and value.strip().isdigit():
        seg = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        seg = value
    else:
        raise DataError(f"{name}: line {where}: SEG_ID must be a positive integer, got {value!r}")
    if not 1 <= seg < BIO_SEG_ID_BASE:
        raise DataError(f"{name}: line {where}: SEG_ID {seg} is outside [1, {BIO_SEG_ID_BASE - 1}]")
    return seg


def _annotations(path: Path) -> list[_Annotation]:
    """The annotations of one engine file, every field checked; scores checked in range."""
    name, engine = str(path), path.stem
    out: list[_Annotation] = []
    for index, (line, item) in enumerate(_json_items(path)):
        where = f"{line} (item {index})"
        if not isinstance(item, dict):
            raise DataError(
                f"{name}: line {where}: an annotation must be a JSON object, got {type(item).__name__}"
            )
        missing = [key for key in _REQUIRED_KEYS if key not in item]
        if missing:
            raise DataError(
                f"{name}: line {where}: missing key(s) {missing}; found {sorted(item)} (was a key renamed?)"
            )
        if item["MT_Engine"] != engine:
            raise DataError(
                f"{name}: line {where}: MT_Engine {item['MT_Engine']!r} is not the engine of the file name ({engine!r})"
            )
        doc_id = item["DOC_ID"]
        match = _DOC_ID.fullmatch(doc_id) if isinstance(doc_id, str) else None
        if match is None:
            raise DataError(f"{name}: line {where}: DOC_ID must look like 'doc<number>', got {doc_id!r}")
        errors = _errors(item, "target_errors", name, where) + _errors(item, "source_errors", name, where)
        try:
            score = mqm_score(errors)
        except DataError as exc:  # mqm_weight does not know the file
            raise DataError(f"{name}: line {where}: {exc}") from exc
        out.append(
            _Annotation(
                line=line,
                doc_id=doc_id,
                doc_number=int(match.group(1)),
                seg=_seg_number(item["SEG_ID"], name, where),
                src=check_text(item["source"], name, where, "source"),
                mt=check_text(item["target"], name, where, "target"),
                annotator=check_text(item["Annotator_ID"], name, where, "Annotator_ID"),
                score=score,
            )
        )
    if not out:
        raise DataError(f"{name}: no annotations (an empty list)")
    check_range(
        np.array([a.score for a in out]),
        BIO_MQM_RANGE,
        name,
        "target_errors",
        "biomedical MQM score (0 = no error, negative = worse)",
        rows=np.array([a.line for a in out]),
    )
    return out


def _aligned(files: Mapping[str, list[_Annotation]], drops: Counter) -> dict[str, list[_Annotation]]:
    """The annotations whose text belongs to their (DOC_ID, SEG_ID); see the module docstring."""
    kept: dict[str, list[_Annotation]] = {}
    for engine, anns in files.items():
        # 1. A copied row repeats the (source, target) of an earlier segment: keep the lowest SEG_ID.
        first: dict[tuple[str, str, str], int] = {}
        for a in anns:
            key = (a.doc_id, a.src, a.mt)
            first[key] = min(first.get(key, a.seg), a.seg)
        kept[engine] = [a for a in anns if first[(a.doc_id, a.src, a.mt)] == a.seg]
        drops[COPIED_TEXT] += len(anns) - len(kept[engine])
    # 2. One vote per engine and distinct source for each segment.
    votes: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for anns in kept.values():
        for seg, src in {((a.doc_id, a.seg), a.src) for a in anns}:
            votes[seg][src] += 1
    canonical: dict[tuple[str, int], str | None] = {}
    for seg, counts in votes.items():
        ranked = counts.most_common(2)
        tied = len(ranked) == 2 and ranked[0][1] == ranked[1][1]
        canonical[seg] = None if tied else ranked[0][0]
    out: dict[str, list[_Annotation]] = {}
    for engine, anns in kept.items():
        out[engine] = []
        for a in anns:
            src = canonical[(a.doc_id, a.seg)]
            if src is None:
                drops[TIED_SOURCE] += 1
            elif a.src != src:
                drops[OTHER_SOURCE] += 1
            else:
                out[engine].append(a)
    return out


def _items(path: Path, anns: list[_Annotation]) -> dict[tuple[str, int], list[_Annotation]]:
    """(DOC_ID, SEG_ID) -> its anns in file order; an annotator twice on one item raises."""
    items: dict[tuple[str, int], list[_Annotation]] = defaultdict(list)
    for a in anns:
        for other in items[(a.doc_id, a.seg)]:
            if other.annotator == a.annotator:
                raise DataError(
                    f"{path}: line {a.line}: annotator {a.annotator!r} rates {a.doc_id} SEG_ID {a.seg} twice "
                    f"(lines {other.line} and {a.line}); keep one annotation per annotator"
                )
        items[(a.doc_id, a.seg)].append(a)
    return items


def _load_direction(root: Path, lp: str, drop_systems: Mapping[str, str]) -> tuple[list[dict], Counter]:
    folder = root / BIO_MQM_REPO / BIO_MQM_DIR / lp.replace("-", "2")
    if not folder.is_dir():
        raise DataError(
            f"{folder}: {DATASET} {lp} folder not found (run `uamt data fetch`, or check the data root)"
        )
    paths = {path.stem: path for path in sorted(folder.glob("*.json"))}
    if not paths:
        raise DataError(f"{folder}: no <engine>.json files for {DATASET} {lp}")
    drops: Counter = Counter()
    aligned = _aligned({engine: _annotations(path) for engine, path in paths.items()}, drops)
    items = {engine: _items(paths[engine], anns) for engine, anns in aligned.items()}
    # Reference texts per segment; the two annotations of an item show one text (checked below).
    ref_text = {
        engine: {seg: anns[0].mt for seg, anns in items[engine].items()}
        for engine in BIO_REFERENCE_ENGINES
        if engine in items
    }
    rows: list[dict] = []
    differing_targets = 0
    for engine in sorted(items):
        reason = _dropped_reason(engine, drop_systems)
        for seg in sorted(items[engine], key=lambda s: (int(s[0][3:]), s[1])):
            anns = items[engine][seg]
            if reason is not None:
                drops[f"system {engine} ({reason})"] += 1
                continue
            available = {ref: texts[seg] for ref, texts in ref_text.items() if seg in texts}
            if engine in BIO_REFERENCE_ENGINES:
                refs = _other_refs(engine, available)
                if not refs:
                    drops[NO_OTHER_REFERENCE] += 1
                    continue
            else:
                refs = [available[ref] for ref in sorted(available)]
                if not refs:
                    drops[NO_REFERENCE] += 1
                    continue
            # Two annotators of one item see the same text but for quote marks in 3 de-en items:
            # the first annotation's text is kept.
            differing_targets += len({a.mt for a in anns}) > 1
            scores = [a.score for a in anns]
            score = sum(scores) / len(scores)
            rows.append(
                _row(
                    dataset=DATASET,
                    lp=lp,
                    src=anns[0].src,
                    mt=anns[0].mt,
                    refs=refs,
                    score=score,
                    score_raw=score,
                    annotator_scores=scores,
                    n_annotators=len(scores),
                    doc=bio_doc_key(lp, seg[0]),
                    system=engine,
                    seg_id=anns[0].doc_number * BIO_SEG_ID_BASE + seg[1],
                    domain="biomedical",
                    year=2021,
                )
            )
    if differing_targets:
        log.info(
            "%s %s: %d items whose annotations show different target texts (kept the first)",
            DATASET,
            lp,
            differing_targets,
        )
    return rows, drops


def load_bio_mqm(
    root: str | Path,
    lps: Iterable[str] = BIO_MQM_LPS,
    *,
    drop_systems: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Biomedical MQM as the canonical table; see the module docstring for files, scores and rows.

    Parameters
    ----------
    root : str or Path
        Folder laid out as ``<owner>/<repo>/<path>`` (``data/raw`` or the offline mirror).
    lps : iterable of str
        Directions to load, from :data:`BIO_MQM_LPS` (``"de-en"`` reads folder ``de2en``).
    drop_systems : mapping of str to str, optional
        ``fnmatch`` pattern of an engine name -> reason: its rated rows are dropped (counted).
        A dropped reference still serves as the reference of the other rows.

    Returns
    -------
    DataFrame
        The canonical table (:mod:`uamt.data.schema`), ``dataset = "bio_mqm"``.  ``score`` and
        ``score_raw``: mean over annotators of the MQM score (0 = no error, negative = worse;
        lowest -70); ``annotator_scores``: each annotator's score on that scale.
        ``df.attrs["dropped"]``: ``{lp: {reason: count}}`` of the annotations and rows left out.

    Raises
    ------
    DataError
        Missing folder or file, bytes that are not UTF-8, JSON that does not parse, an annotation
        without a key, with empty text, an unknown severity, a malformed ``DOC_ID``/``SEG_ID``, an
        ``MT_Engine`` other than its file's, a score outside :data:`BIO_MQM_RANGE`, or an
        annotator rating an item twice: the message names the file and the line (and item).
    """
    root = Path(root)
    drop_systems = dict(drop_systems or {})
    rows: list[dict] = []
    dropped: dict[str, dict[str, int]] = {}
    for lp in _check_lps(lps, BIO_MQM_LPS, DATASET):
        lp_rows, drops = _load_direction(root, lp, drop_systems)
        _log_drops(DATASET, lp, drops)
        dropped[lp] = {reason: count for reason, count in sorted(drops.items()) if count}
        rows.extend(lp_rows)
    df = _frame(rows)
    df.attrs["dropped"] = dropped
    return df


def bio_doc_splits(root: str | Path) -> dict[str, str]:
    """The authors' split of the documents: :func:`bio_doc_key` -> ``"dev"`` or ``"test"``.

    From ``data/doc_id_splits.json`` (Zouhar et al. 2024 held out whole documents: "test" for
    evaluation, "dev" for fine-tuning on the domain).  It covers 11 directions (its ``br-en`` is
    our ``pt-en``); the documents of en-eu, en-it, en-pt and it-en are in neither split and are
    absent from the mapping.  It names 4 pt-en documents that have no anns in v2.

    Parameters
    ----------
    root : str or Path
        Folder laid out as ``<owner>/<repo>/<path>``.

    Returns
    -------
    dict of str to str
        ``doc`` value (as in :func:`load_bio_mqm`) -> ``"dev"`` or ``"test"``.

    Raises
    ------
    DataError
        The file is missing, not UTF-8 or not JSON, names an unknown direction, has a direction
        without exactly ``dev`` and ``test`` lists of ``doc<number>`` ids, or puts a document in
        both.
    """
    path = _require_file(Path(root) / BIO_MQM_REPO / BIO_SPLITS_FILE, f"{DATASET} document split file")
    name = str(path)
    try:
        data = json.loads(decode_text(path.read_bytes(), name))
    except json.JSONDecodeError as exc:
        raise DataError(f"{name}: line {exc.lineno}: not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise DataError(f"{name}: expected an object {{direction: {{'dev': [...], 'test': [...]}}}}")
    out: dict[str, str] = {}
    for key, parts in data.items():
        lp = BIO_SPLIT_LP_ALIASES.get(key, key)
        if lp not in BIO_MQM_LPS:
            raise DataError(f"{name}: unknown direction {key!r}; expected one of {sorted(BIO_MQM_LPS)}")
        if not isinstance(parts, dict) or sorted(parts) != ["dev", "test"]:
            found = sorted(parts) if isinstance(parts, dict) else type(parts).__name__
            raise DataError(f"{name}: {key}: expected exactly the lists 'dev' and 'test', found {found}")
        for split in ("dev", "test"):
            docs = parts[split]
            if not isinstance(docs, list):
                raise DataError(f"{name}: {key}.{split}: expected a list of document ids")
            for doc_id in docs:
                if not isinstance(doc_id, str) or not _DOC_ID.fullmatch(doc_id):
                    raise DataError(
                        f"{name}: {key}.{split}: document id must look like 'doc<number>', got {doc_id!r}"
                    )
                doc = bio_doc_key(lp, doc_id)
                if out.get(doc, split) != split:
                    raise DataError(f"{name}: {key}: document {doc_id!r} is in both 'dev' and 'test'")
                out[doc] = split
    return out
