"""Document- and source-disjoint splits, across datasets.

The split unit is a connected component of the graph whose nodes are rows, linked when they
share a document (``doc``, already namespaced ``<testset>/<source language>/<doc id>``, so the
same newstest2021 document links WMT21 DA and MQM) or the same normalised source sentence
(:func:`uamt.data.schema.normalise_source`, which links e.g. MLQE et-en and the multi-hypothesis
et-en set).  No source sentence and no document can then fall in two splits.

Components with a row of a dataset in ``forced`` go wholly to that split (first match in
``forced`` order wins).  The others are assigned per dataset x language pair (the one holding most
of the component's rows, so each dataset's LP is balanced on its own): in the order of
``sha256(seed:component key)`` each component goes to the split whose row count is furthest
below its target ``fraction * rows of that dataset x LP``.  The component
key is the smallest ``doc`` in it, so the result depends on the set of rows, never their order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from uamt.core.errors import DataError
from uamt.core.fileio import sha256_text
from uamt.data.schema import SPLITS, normalise_source

log = logging.getLogger(__name__)

DEFAULT_FRACTIONS = {"d_q": 0.35, "d_e": 0.35, "dev": 0.10, "test": 0.20}


def check_fractions(fractions: Mapping[str, float], forced: Mapping[str, str]) -> None:
    unknown = sorted(set(fractions) - set(SPLITS)) + sorted(set(forced.values()) - set(SPLITS))
    if unknown:
        raise ValueError(f"split={unknown[0]!r} not supported; choose from {sorted(SPLITS)}")
    if not fractions:
        raise ValueError("fractions must name at least one split")
    if any(f < 0 for f in fractions.values()) or not np.isclose(sum(fractions.values()), 1.0):
        raise ValueError(f"split fractions must be >= 0 and sum to 1, got {dict(fractions)}")


def components(df: pd.DataFrame) -> np.ndarray:
    """Component label of each row (rows linked by equal ``doc`` or equal normalised ``src``)."""
    doc_codes, doc_uniques = pd.factorize(df["doc"].to_numpy(), sort=False)
    src_codes, src_uniques = pd.factorize(np.array([normalise_source(s) for s in df["src"]], dtype=object))
    n_doc, n_src = len(doc_uniques), len(src_uniques)
    # Bipartite graph doc-node -- src-node, one edge per row; a row's component is its doc's.
    graph = coo_matrix(
        (np.ones(len(df), dtype=np.int8), (doc_codes, n_doc + src_codes)), shape=(n_doc + n_src,) * 2
    )
    _, labels = connected_components(graph, directed=False)
    return labels[doc_codes]


def assign_splits(
    df: pd.DataFrame,
    fractions: Mapping[str, float] | None = None,
    forced: Mapping[str, str] | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Return a copy of ``df`` with ``split`` and ``group`` filled; see the module docstring."""
    fractions = dict(DEFAULT_FRACTIONS if fractions is None else fractions)
    if forced is None:
        from uamt.data.datasets import default_forced_splits  # the declarations import the loaders

        forced = default_forced_splits()
    forced = dict(forced)
    check_fractions(fractions, forced)
    out = df.copy()
    if out.empty:
        return out
    labels = components(out)
    comp = pd.DataFrame(
        {
            "label": labels,
            "doc": out["doc"].to_numpy(),
            "stratum": (out["dataset"] + " " + out["lp"]).to_numpy(),
        }
    )
    keys = comp.groupby("label")["doc"].min()
    group_of_label = {lab: "g-" + sha256_text(key)[:16] for lab, key in keys.items()}
    out["group"] = [group_of_label[lab] for lab in labels]

    split_of_label: dict[int, str] = {}
    for dataset, split in forced.items():
        hit = np.unique(labels[(out["dataset"] == dataset).to_numpy()])
        for lab in hit:
            if lab in split_of_label and split_of_label[lab] != split:
                log.warning(
                    "component %s has rows of several forced datasets; keeping split %s",
                    group_of_label[lab],
                    split_of_label[lab],
                )
                continue
            split_of_label.setdefault(int(lab), split)

    free = comp[~comp["label"].isin(list(split_of_label))]
    sizes = free.groupby(["label", "stratum"]).size().rename("n").reset_index()
    # Home stratum (dataset x LP) of a component: the one with most rows (ties: alphabetical).
    sizes = sizes.sort_values(["label", "n", "stratum"], ascending=[True, False, True])
    home = sizes.drop_duplicates("label").set_index("label")["stratum"]
    comp_size = free.groupby("label").size()
    order_names = list(fractions)
    for stratum in sorted(set(home)):
        labs = home.index[home == stratum]
        ranked = sorted(labs, key=lambda lab: sha256_text(f"{seed}:{keys[lab]}"))
        total = float(comp_size[labs].sum())
        assigned = dict.fromkeys(order_names, 0.0)
        for lab in ranked:
            deficits = [fractions[s] * total - assigned[s] for s in order_names]
            best = order_names[int(np.argmax(deficits))]
            split_of_label[int(lab)] = best
            assigned[best] += float(comp_size[lab])
    out["split"] = [split_of_label[int(lab)] for lab in labels]
    return out


def check_disjoint(df: pd.DataFrame) -> None:
    """Raise :class:`DataError` if a normalised source sentence or a document is in two splits."""
    keys = {
        "source sentence": pd.Series([normalise_source(s) for s in df["src"]], index=df.index),
        "document": df["doc"],
    }
    for what, key in keys.items():
        n_splits = df.groupby(key.to_numpy())["split"].nunique()
        leaked = n_splits[n_splits > 1]
        if len(leaked):
            example = leaked.index[0]
            splits = sorted(df.loc[(key == example).to_numpy(), "split"].unique())
            raise DataError(
                f"split leak: {len(leaked)} {what}(s) appear in more than one split, e.g. {example!r} in {splits}"
            )
