"""benchmarks/miss_balance.py: misses per dataset x LP with document-clustered standard errors."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from benchmarks.miss_balance import clustered_se, miss_table


def test_clustered_se_by_hand():
    values = np.array([1.0, 1.0, 0.0, 0.0])
    # one document per row: the binomial standard error sqrt(p (1 - p) / n) = sqrt(0.25 / 4)
    assert clustered_se(values, np.array(["a", "b", "c", "d"])) == pytest.approx(0.25)
    # two documents, each all-in or all-out: sqrt(1^2 + 1^2) / 4
    assert clustered_se(values, np.array(["a", "a", "b", "b"])) == pytest.approx(np.sqrt(2) / 4)
    # each document half in, half out: the documents agree, so no spread between them
    assert clustered_se(values, np.array(["a", "b", "a", "b"])) == pytest.approx(0.0)


def test_miss_table_counts_below_and_above_per_dataset_and_lp():
    n = 40
    table = pd.DataFrame(
        {
            "dataset": ["wmt21_mqm"] * n + ["wmt23_mqm"] * n,
            "lp": ["en-de"] * (2 * n),
            "doc": [f"d{i % 4}" for i in range(2 * n)],
            "human": np.r_[np.full(n, -10.0), np.full(n, 1.0)],  # first campaign below, second above
        }
    )
    rows = SimpleNamespace(
        intervals={0.9: (np.full(2 * n, -5.0), np.full(2 * n, 0.0))},
        cdf_at_bounds=None,
        cdf_at_human=None,
        center=np.full(2 * n, -2.0),
    )
    got = {r["rows"]: r for r in miss_table(rows, table, 0.9, None)}
    assert set(got) == {"wmt21_mqm en-de", "wmt23_mqm en-de", "(LP) en-de"}
    assert (got["wmt21_mqm en-de"]["below"], got["wmt21_mqm en-de"]["above"]) == (1.0, 0.0)
    assert (got["wmt23_mqm en-de"]["below"], got["wmt23_mqm en-de"]["above"]) == (0.0, 1.0)
    assert (got["(LP) en-de"]["below"], got["(LP) en-de"]["n"], got["(LP) en-de"]["docs"]) == (0.5, 80, 4)
