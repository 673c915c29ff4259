"""The dataset declarations: one home that every consumer reads, and registries that refuse."""

from __future__ import annotations

import pandas as pd
import pytest

from uamt.core.config import ConfigError
from uamt.data.datasets import DATASET_SPECS, DATASETS, dataset_spec, default_forced_splits
from uamt.data.prepare import PrepareConfig, limit_rows


def test_unknown_dataset_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"dataset='wmt99' not supported; choose from \['bio_mqm'"):
        dataset_spec("wmt99")
    with pytest.raises(ConfigError, match=r"prepare: dataset='wmt99' not supported"):
        PrepareConfig(datasets=("wmt99",))


def test_consumers_read_the_declarations():
    from uamt.ingest import config as incoming
    from uamt.serving import calibrated_predictor as pyfunc

    for name, spec in DATASET_SPECS.items():
        assert incoming.DEFAULT_BOUNDS[name] == spec.score_range
        assert incoming.DEFAULT_LPS[name] == spec.lps
        lo, hi = spec.score_range
        assert lo < hi
    assert default_forced_splits() == {"ted_mqm": "ood", "bio_mqm": "ood", "multihyp_eten": "test"}
    assert pyfunc.scale_for(("wmt21_mqm", "wmt23_mqm", "wmt23_sxs_mqm")).name == "MQM"
    with pytest.raises(Exception, match="do not share one known human score scale"):
        pyfunc.scale_for(("wmt21_mqm", "wmt21_da"))
    assert set(DATASETS) >= {"wmt21_da", "wmt21_mqm", "ted_mqm", "wmt23_mqm", "wmt23_sxs_mqm", "bio_mqm"}
    assert not DATASET_SPECS["mlqe"].reference_based and not DATASET_SPECS["qt21_hter"].higher_is_better


def _docs(dataset: str, n_docs: int, rows_per_doc: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "dataset": dataset,
            "lp": "en-de",
            "doc": [f"{dataset}/d{i}" for i in range(n_docs) for _ in range(rows_per_doc)],
        }
    )


def test_row_cap_per_dataset_keeps_whole_documents_and_other_datasets_whole():
    table = pd.concat([_docs("bio_mqm", 20, 10), _docs("wmt21_mqm", 20, 10)], ignore_index=True)
    capped = limit_rows(table, {"bio_mqm": 45}, seed=13)
    bio = capped[capped.dataset == "bio_mqm"]
    assert len(bio) == 50 and bio.groupby("doc").size().eq(10).all()  # 5 whole documents
    assert len(capped[capped.dataset == "wmt21_mqm"]) == 200
    assert len(limit_rows(table, 45, seed=13)) == 100  # one cap for every dataset
    reversed_rows = limit_rows(table.iloc[::-1], {"bio_mqm": 45}, seed=13)
    assert set(reversed_rows["doc"]) == set(capped["doc"])  # the choice does not depend on row order


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        ({"wmt99": 10}, r"prepare.max_rows_per_lp: dataset='wmt99' not supported"),
        ({"bio_mqm": 0}, r"prepare.max_rows_per_lp.bio_mqm must be >= 1"),
        (0, r"prepare.max_rows_per_lp must be >= 1"),
    ],
)
def test_row_cap_is_validated(cap, message):
    with pytest.raises(ConfigError, match=message):
        PrepareConfig(max_rows_per_lp=cap)
