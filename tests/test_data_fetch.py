"""uamt data fetch: mirror copy, sha256 check, skip-if-present, download path, atomic writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from uamt.core.config import load_section
from uamt.core.errors import ChecksumError, DataError
from uamt.data.fetch import FetchConfig, SourceFiles, fetch_all
from uamt.stages import fetch as fetch_stage

REPO = "deep-spin/UA_COMET"
PATH = "evaluation/data/human_scores/hter/test.smt.de-en.csv"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cfg(tmp_path: Path, mirror: Path | None, sha: str, **kw) -> FetchConfig:
    return FetchConfig(
        mirror=str(mirror) if mirror else None,
        raw_dir=str(tmp_path / "raw"),
        sources=(SourceFiles(repo=REPO, commit="0" * 40, files={PATH: sha}),),
        **kw,
    )


def test_mirror_copy_then_skip(tmp_path, mirror_root):
    sha = _sha(mirror_root / REPO / PATH)
    cfg = _cfg(tmp_path, mirror_root, sha)
    first = fetch_all(cfg)
    dest = tmp_path / "raw" / REPO / PATH
    assert (
        first.copied == (f"{REPO}/{PATH}",) and dest.read_bytes() == (mirror_root / REPO / PATH).read_bytes()
    )
    second = fetch_all(cfg)
    assert second.skipped == (f"{REPO}/{PATH}",) and not second.copied


def test_sha_mismatch_names_file_and_hashes_and_leaves_nothing(tmp_path, mirror_root):
    mirror = tmp_path / "mirror"
    src = mirror / REPO / PATH
    src.parent.mkdir(parents=True)
    good = (mirror_root / REPO / PATH).read_bytes()
    src.write_bytes(good[:-10] + b"corrupted!")
    expected = hashlib.sha256(good).hexdigest()
    with pytest.raises(
        ChecksumError, match=rf"test\.smt\.de-en\.csv: sha256 mismatch: expected {expected}, got {_sha(src)}"
    ):
        fetch_all(_cfg(tmp_path, mirror, expected))
    dest_dir = tmp_path / "raw" / REPO / Path(PATH).parent
    assert list(dest_dir.iterdir()) == []  # no half-written or temp file


def test_wrong_file_present_is_replaced(tmp_path, mirror_root):
    sha = _sha(mirror_root / REPO / PATH)
    dest = tmp_path / "raw" / REPO / PATH
    dest.parent.mkdir(parents=True)
    dest.write_text("stale")
    report = fetch_all(_cfg(tmp_path, mirror_root, sha))
    assert report.copied and _sha(dest) == sha


def test_missing_in_mirror(tmp_path):
    (tmp_path / "mirror").mkdir()
    with pytest.raises(DataError, match="not in the mirror"):
        fetch_all(_cfg(tmp_path, tmp_path / "mirror", "0" * 64))


def test_download_through_url_template(tmp_path, mirror_root, monkeypatch):
    # A file:// template exercises the download path without a network.
    monkeypatch.delenv("UAMT_DATA_MIRROR", raising=False)
    sha = _sha(mirror_root / REPO / PATH)
    cfg = _cfg(tmp_path, None, sha, url_template=f"file://{mirror_root}/{{repo}}/{{path}}")
    assert fetch_all(cfg).downloaded == (f"{REPO}/{PATH}",)
    bad = _cfg(tmp_path / "b", None, sha, url_template=f"file://{tmp_path}/nowhere/{{path}}")
    with pytest.raises(DataError, match="download failed.*offline"):
        fetch_all(bad)


def test_env_mirror_and_stage_main(tmp_path, mirror_root, monkeypatch):
    sha = _sha(mirror_root / REPO / PATH)
    params = tmp_path / "params.yaml"
    params.write_text(
        f"fetch:\n  raw_dir: {tmp_path / 'raw'}\n  sources:\n    - repo: {REPO}\n      commit: '{'0' * 40}'\n"
        f"      files:\n        {PATH}: {sha}\n"
    )
    monkeypatch.setenv("UAMT_DATA_MIRROR", str(mirror_root))
    assert load_section(FetchConfig, "fetch", params).sources[0].files == {PATH: sha}
    assert fetch_stage.main(["--params", str(params)]) == 0
    assert _sha(tmp_path / "raw" / REPO / PATH) == sha


def test_project_params_pin_every_mirror_file(mirror_root):
    cfg = load_section(FetchConfig, "fetch", Path(__file__).resolve().parents[1] / "params.yaml")
    n = sum(len(s.files) for s in cfg.sources)
    assert n > 150
    for source in cfg.sources[:1]:
        for path, sha in list(source.files.items())[:3]:
            assert _sha(mirror_root / source.repo / path) == sha
