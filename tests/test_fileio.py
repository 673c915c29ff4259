"""The one atomic writer every output goes through (uamt.fileio)."""

from __future__ import annotations

import os
import stat

import pytest

from uamt.errors import DataError
from uamt.fileio import atomic_path, atomic_write_bytes, atomic_write_text


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
