"""benchmarks/lock_diff.py: two dvc.lock files compared stage by stage."""

from __future__ import annotations

import yaml

from benchmarks.lock_diff import compare_stage, main


def _stage(out_md5: str, code_md5: str = "c1", params: dict | None = None) -> dict:
    return {
        "cmd": "python -m uamt.stages.x",
        "deps": [{"path": "data/prepared", "md5": "d1.dir"}, {"path": "src/uamt/x.py", "md5": code_md5}],
        "params": {"params.yaml": params or {"x": 1}},
        "outs": [{"path": "models/x", "md5": out_md5, "size": 3}, {"path": "metrics/x.json", "md5": "m1"}],
    }


def _write(path, stages: dict) -> str:
    path.write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}), encoding="utf-8")
    return str(path)


def test_compare_stage_names_the_differing_outputs_and_inputs():
    same = compare_stage(_stage("a.dir"), _stage("a.dir"))
    assert same == {"outs": {}, "outs_same": ["metrics/x.json", "models/x"], "deps": [], "params": []}
    moved = compare_stage(_stage("a.dir"), _stage("b.dir", code_md5="c2", params={"x": 2}))
    assert moved["outs"] == {"models/x": ("a.dir", "b.dir")}
    assert moved["deps"] == ["src/uamt/x.py"] and moved["params"] == ["params.yaml"]


def test_main_exits_1_and_prints_each_differing_stage(tmp_path, capsys):
    a = _write(tmp_path / "a.lock", {"prepare": _stage("p.dir"), "encode": _stage("e1.dir")})
    b = _write(tmp_path / "b.lock", {"prepare": _stage("p.dir"), "encode": _stage("e2.dir"), "new": _stage("n")})
    assert main([a, a]) == 0
    assert main([a, b]) == 1
    out = capsys.readouterr().out
    assert "prepare              same outputs" in out
    assert "models/x: e1.dir -> e2.dir" in out
    assert f"new                  only in {b}" in out
    assert main([a, b, "--stages", "prepare"]) == 0


def test_a_listing_names_the_files_that_differ_inside_a_folder(tmp_path, capsys):
    import json
    import subprocess

    from benchmarks.lock_diff import listing

    repo = tmp_path / "repo"
    cache = repo / ".dvc" / "cache" / "files" / "md5"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    lock = {"prepare": _stage("ab1234.dir")}
    _write(repo / "dvc.lock", lock)
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "1234.dir").write_text(json.dumps([{"md5": "m1", "relpath": "a.parquet"}, {"md5": "m2", "relpath": "summary.json"}]))
    mine = listing(repo)
    assert mine["stages"]["prepare"]["outs"][0]["files"] == {"a.parquet": "m1", "summary.json": "m2"}
    assert "deps" not in mine["stages"]["prepare"]  # the inputs stay in dvc.lock
    assert mine["stages"]["prepare"]["outs"][1].get("files") is None  # a file output, not a folder
    saved = tmp_path / "mine.json"
    saved.write_text(json.dumps(mine))

    (cache / "cd").mkdir()
    (cache / "cd" / "5678.dir").write_text(json.dumps([{"md5": "m1", "relpath": "a.parquet"}, {"md5": "m3", "relpath": "summary.json"}]))
    _write(repo / "dvc.lock", {"prepare": _stage("cd5678.dir")})
    assert main([str(saved), "--listing-of", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "inputs not compared (a listing)" in out
    assert "1 of 2 files differ: summary.json" in out


def test_a_listing_hashes_an_uncached_folder_in_the_workspace(tmp_path):
    import hashlib
    import subprocess

    from benchmarks.lock_diff import listing

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    stage = _stage("ef0000.dir")
    stage["outs"][0]["path"] = "cache/embeddings"  # cache: false, as encode's output is
    _write(repo / "dvc.lock", {"encode": stage})
    (repo / "cache" / "embeddings" / "shards").mkdir(parents=True)
    (repo / "cache" / "embeddings" / "shards" / "000000.npy").write_bytes(b"abc")
    out = listing(repo)["stages"]["encode"]["outs"][0]
    assert out["files"] == {"shards/000000.npy": hashlib.md5(b"abc").hexdigest()}
    assert out["files_from"] == "workspace"
    (repo / "cache" / "embeddings" / "shards" / "000000.npy").unlink()
    (repo / "cache" / "embeddings" / "shards").rmdir()
    (repo / "cache" / "embeddings").rmdir()
    assert listing(repo)["stages"]["encode"]["outs"][0]["files"] is None
