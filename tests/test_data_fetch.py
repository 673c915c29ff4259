"""uamt data fetch: mirror copy, sha256 check, skip-if-present, download path, atomic writes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from uamt.core.config import ConfigError
from uamt.core.errors import ChecksumError, DataError
from uamt.data.fetch import FetchConfig, SourceFiles, fetch_all, load_data_sources, load_fetch_config
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


def _pins(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data_sources.yaml"
    path.write_text(text)
    return path


def _params(tmp_path: Path, pins: Path, extra: str = "") -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(f"fetch:\n  raw_dir: {tmp_path / 'raw'}\n  sources_file: {pins}\n{extra}")
    return path


def test_env_mirror_and_stage_main(tmp_path, mirror_root, monkeypatch):
    sha = _sha(mirror_root / REPO / PATH)
    pins = _pins(tmp_path, f"{REPO}:\n  commit: '{'0' * 40}'\n  files:\n    {PATH}: {sha}\n")
    params = _params(tmp_path, pins)
    monkeypatch.setenv("UAMT_DATA_MIRROR", str(mirror_root))
    cfg = fetch_stage.load_config(params)
    assert cfg.sources == (SourceFiles(repo=REPO, commit="0" * 40, files={PATH: sha}),)
    assert fetch_stage.main(["--params", str(params)]) == 0
    assert _sha(tmp_path / "raw" / REPO / PATH) == sha


def test_project_pins_every_mirror_file_outside_params_yaml(mirror_root):
    root = Path(__file__).resolve().parents[1]
    cfg = load_fetch_config(root / "params.yaml")
    n = sum(len(s.files) for s in cfg.sources)
    assert n > 150 and cfg.sources_file == "data_sources.yaml"
    assert cfg.sources == load_data_sources(root / "data_sources.yaml")
    # params.yaml keeps the knobs: no sha256 pin in it
    assert not re.search(r"\b[0-9a-f]{64}\b", (root / "params.yaml").read_text())
    for source in cfg.sources[:1]:
        for path, sha in list(source.files.items())[:3]:
            assert _sha(mirror_root / source.repo / path) == sha


GOOD = f"{REPO}:\n  commit: '{'a' * 40}'\n  files:\n    {PATH}: '{'b' * 64}'\n"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (GOOD.replace("  files:", "  file:"), rf"data_sources\.yaml:{REPO}: unknown key\(s\) \['file'\]"),
        (GOOD.replace("  commit:", "  comit:"), rf"data_sources\.yaml:{REPO}: unknown key\(s\) \['comit'\]"),
        (f"{REPO}:\n  files:\n    {PATH}: '{'b' * 64}'\n", rf"{REPO}: required key 'commit' is missing"),
        (GOOD.replace("'" + "a" * 40 + "'", "abc123"), rf"{REPO}\.commit: expected a 40-digit hexadecimal"),
        (GOOD.replace("'" + "a" * 40 + "'", "1234"), rf"{REPO}\.commit: expected str, got 1234"),
        (GOOD.replace("b" * 64, "b" * 63), rf"{REPO}\.files\.{re.escape(PATH)}: expected a sha256"),
        (GOOD.replace("'" + "b" * 64 + "'", "[x]"), rf"{REPO}\.files\.{re.escape(PATH)}: expected str"),
        (f"{REPO}:\n  commit: '{'a' * 40}'\n  files: {{}}\n", rf"{REPO}\.files: empty"),
        (f"{REPO}:\n  commit: '{'a' * 40}'\n  files: [a, b]\n", rf"{REPO}\.files: expected a mapping"),
        (GOOD.replace(REPO, "UA_COMET"), r"data_sources\.yaml:UA_COMET: a key must be a GitHub repository"),
        (f"{REPO}: [a]\n", rf"data_sources\.yaml:{REPO}: must be a mapping"),
        ("# nothing pinned\n", r"data_sources\.yaml: pins no file"),
        ("- a\n- b\n", r"data_sources\.yaml: top level must be a mapping"),
    ],
)
def test_bad_sources_file_is_refused_naming_file_repo_and_key(tmp_path, text, match):
    pins = _pins(tmp_path, text)
    with pytest.raises(ConfigError, match=match):
        load_fetch_config(_params(tmp_path, pins))
    # the stage reports it as a config error (exit 2) and fetches nothing
    assert fetch_stage.main(["--params", str(_params(tmp_path, pins))]) == 2
    assert not (tmp_path / "raw").exists()


def test_good_sources_file_loads(tmp_path):
    cfg = load_fetch_config(_params(tmp_path, _pins(tmp_path, GOOD)))
    assert cfg.sources == (SourceFiles(repo=REPO, commit="a" * 40, files={PATH: "b" * 64}),)


def test_missing_sources_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nowhere\.yaml: sources file not found"):
        load_fetch_config(_params(tmp_path, tmp_path / "nowhere.yaml"))


def test_pins_inside_params_are_refused_pointing_to_the_sources_file(tmp_path):
    """One home for the pins: an old params.yaml that still lists fetch.sources fails saying where
    they go, instead of one of the two lists being silently ignored."""
    pins = _pins(tmp_path, GOOD)
    extra = f"  sources:\n    - repo: {REPO}\n      commit: '{'a' * 40}'\n      files: {{}}\n"
    with pytest.raises(
        ConfigError, match=rf"params\.yaml:fetch\.sources: .*move them to the sources file {pins}"
    ):
        load_fetch_config(_params(tmp_path, pins, extra))


def test_a_relative_sources_file_is_read_beside_the_params_file(tmp_path, monkeypatch):
    """As an include: the project's params.yaml finds its pins from any working directory."""
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    assert load_fetch_config(root / "params.yaml").sources == load_data_sources(root / "data_sources.yaml")
    (tmp_path / "conf").mkdir()
    _pins(tmp_path / "conf", GOOD)
    params = tmp_path / "conf" / "params.yaml"
    params.write_text("fetch:\n  sources_file: data_sources.yaml\n")
    assert load_fetch_config(params).sources[0].repo == REPO
