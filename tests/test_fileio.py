"""The one atomic writer every output goes through (uamt.core.fileio)."""

from __future__ import annotations

import os
import stat

import pytest

from uamt.core.errors import DataError
from uamt.core.fileio import atomic_path, atomic_write_bytes, atomic_write_text


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_written_file_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "report.md", "# report\n")
    finally:
        os.umask(old)
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == "# report\n"
    assert _mode(tmp_path / "report.md") == 0o644


def test_an_error_in_the_body_leaves_the_previous_file_and_no_temp(tmp_path):
    target = tmp_path / "weights.pt"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError, match="checksum"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half-writ")
        raise RuntimeError("checksum mismatch")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.pt"]


def test_return_inside_the_block_installs_the_file(tmp_path):
    def fetch() -> str:
        with atomic_path(tmp_path / "data.tsv", suffix=".part") as tmp:
            tmp.write_text("a\tb\n", encoding="utf-8")
            assert tmp.name.endswith(".part") and tmp.name.startswith(".data.tsv.")
            return "copied"

    assert fetch() == "copied"
    assert (tmp_path / "data.tsv").read_text(encoding="utf-8") == "a\tb\n"
    assert [p.name for p in tmp_path.iterdir()] == ["data.tsv"]


def test_missing_folder_is_a_data_error_naming_the_path(tmp_path):
    with pytest.raises(DataError, match=r"out\.json: cannot write in"):
        atomic_write_text(tmp_path / "missing" / "out.json", "{}")


def test_json_and_parquet_writers_write_the_bytes_of_the_plain_calls(tmp_path):
    import json

    import pandas as pd

    from uamt.core.fileio import atomic_write_json, atomic_write_parquet

    data = {"b": [1.5, None], "a": "ü"}
    atomic_write_json(tmp_path / "m.json", data, indent=2, sort_keys=True)
    assert (tmp_path / "m.json").read_text(encoding="utf-8") == json.dumps(data, indent=2, sort_keys=True) + "\n"
    with pytest.raises(ValueError, match="Out of range float"):
        atomic_write_json(tmp_path / "m.json", {"x": float("nan")}, allow_nan=False)
    assert json.loads((tmp_path / "m.json").read_text(encoding="utf-8")) == data  # the old file stays

    frame = pd.DataFrame({"mu": [0.1, 0.2], "lp": ["en-de", "zh-en"]})
    atomic_write_parquet(tmp_path / "p.parquet", frame, index=False)
    frame.to_parquet(tmp_path / "plain.parquet", index=False)
    assert (tmp_path / "p.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "p.parquet", "plain.parquet"]


def test_figure_keeps_its_format_and_leaves_no_temp(tmp_path):
    from uamt.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "figs" / "curve.png")
    assert (tmp_path / "figs" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in (tmp_path / "figs").iterdir()] == ["curve.png"]


def test_atomic_dir_replaces_the_folder_or_leaves_the_old_one(tmp_path):
    from uamt.core.fileio import atomic_dir

    out = tmp_path / "prepared"
    old = os.umask(0o022)
    try:
        with atomic_dir(out) as tmp:
            (tmp / "train.parquet").write_bytes(b"v1")
    finally:
        os.umask(old)
    assert _mode(out) == 0o755  # not mkdtemp's 0700
    with pytest.raises(RuntimeError, match="killed"), atomic_dir(out) as tmp:
        (tmp / "train.parquet").write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert (out / "train.parquet").read_bytes() == b"v1"
    with atomic_dir(out) as tmp:
        (tmp / "test.parquet").write_bytes(b"v2")
    assert [p.name for p in out.iterdir()] == ["test.parquet"]
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]  # no .tmp-/.old- folder left


def test_sha256_helpers_agree_and_the_cache_sees_a_changed_file(tmp_path):
    from uamt.core.fileio import sha256_bytes, sha256_file, sha256_file_cached, sha256_text

    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha256_bytes(b"") == sha256_text("") == empty
    path = tmp_path / "w.bin"
    path.write_bytes("größe".encode())
    assert sha256_file(path, chunk=2) == sha256_text("größe") == sha256_file_cached(path)
    path.write_bytes(b"other content")
    assert sha256_file_cached(path) == sha256_bytes(b"other content")
