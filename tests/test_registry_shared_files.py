"""Identical large files of registered versions are stored once (hard links), each version complete."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd

from uamt.core.fileio import sha256_file
from uamt.registry import shared_files
from uamt.registry.shared_files import SHARED_DIR, share_identical_files


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def inode(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_dev, stat.st_ino


BIG = os.urandom(4096)


def test_identical_files_become_one_and_each_folder_stays_whole(tmp_path):
    root = tmp_path / "artifacts"
    first = write(root / "models" / "m-1" / "encoder" / "encoder.onnx.data", BIG)
    assert share_identical_files(root / "models" / "m-1", root, min_bytes=1024) == 0  # nothing earlier
    second = write(root / "models" / "m-2" / "encoder" / "encoder.onnx.data", BIG)
    other = write(root / "models" / "m-2" / "weights.pt", os.urandom(4096))  # new content: kept as is
    small = write(root / "models" / "m-2" / "spec.json", BIG[:100])  # below min_bytes: not hashed
    assert share_identical_files(root / "models" / "m-2", root, min_bytes=1024) == len(BIG)
    assert inode(first) == inode(second) == inode(root / SHARED_DIR / sha256_file(first))
    assert second.read_bytes() == BIG and other.stat().st_nlink == 2 and small.stat().st_nlink == 1
    # A version deleted (as MLflow deletes its folder) leaves the other whole; its last link goes.
    for path in sorted((root / "models" / "m-1").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert second.read_bytes() == BIG
    assert share_identical_files(root / "models" / "m-2", root, min_bytes=1024) == 0  # idempotent
    for path in (second, other):
        path.unlink()
    share_identical_files(root / "models" / "m-2", root, min_bytes=1024)
    assert list((root / SHARED_DIR).iterdir()) == []  # no model links them any more


def test_a_file_system_without_hard_links_keeps_full_copies(tmp_path, monkeypatch):
    root = tmp_path / "artifacts"
    write(root / "models" / "m-1" / "blob", BIG)
    second = write(root / "models" / "m-2" / "blob", BIG)

    def refuse(*args, **kwargs):
        raise PermissionError("hard links not supported")

    monkeypatch.setattr(shared_files.os, "link", refuse)
    assert share_identical_files(root / "models" / "m-1", root, min_bytes=1024) == 0
    assert share_identical_files(root / "models" / "m-2", root, min_bytes=1024) == 0
    assert second.read_bytes() == BIG and second.stat().st_nlink == 1


def register_versions(uri: str, name: str, python_model, blob: Path, count: int) -> list[str]:
    """``count`` versions of ``name`` through ``register_candidate``, each carrying ``blob``."""
    from uamt.registry import store as registry

    return [
        registry.register_candidate(
            uri,
            name,
            run_name="register",
            python_model=python_model,
            artifacts={"blob": str(blob)},
            signature=None,
            test_metrics={"pps": 0.3},
            tags={"method": "hts"},
        )
        for _ in range(count)
    ]


def test_registered_versions_share_their_identical_files_and_load_alone(project_store, monkeypatch, tmp_path):
    """Two versions of one model through ``register_candidate``: the identical artefact is one file
    on disk, and each version still loads when the other's folder is gone."""
    import mlflow
    from mlflow import MlflowClient

    class EchoSize(mlflow.pyfunc.PythonModel):
        def load_context(self, context):
            self.size = len(Path(context.artifacts["blob"]).read_bytes())

        def predict(self, context, model_input, params=None):
            return pd.DataFrame({"mu": [float(self.size)] * len(model_input)})

    blob = write(tmp_path / "blob.bin", os.urandom(2 << 20))  # above MIN_BYTES, as an encoder export is
    versions = register_versions(project_store, "uamt-shared", EchoSize(), blob, 2)
    client = MlflowClient(project_store)
    folders = []
    for version in versions:
        model_id = client.get_model_version("uamt-shared", version).source.split("/")[-1]
        folders.append(Path(client.get_logged_model(model_id).artifact_location.removeprefix("file://")))
    stored = [next(folder.rglob("blob.bin")) for folder in folders]
    assert inode(stored[0]) == inode(stored[1]) and stored[0].stat().st_nlink == 3  # + the .shared entry
    shutil.rmtree(folders[0])
    loaded = mlflow.pyfunc.load_model(f"models:/uamt-shared/{versions[1]}")
    assert loaded.predict(pd.DataFrame({"x": [1]}))["mu"].tolist() == [float(2 << 20)]


def test_the_default_threshold_skips_small_files(tmp_path):
    root = tmp_path / "artifacts"
    write(root / "a" / "small", b"x" * 100)
    write(root / "b" / "small", b"x" * 100)
    share_identical_files(root / "a", root)
    share_identical_files(root / "b", root)
    assert (root / "b" / "small").stat().st_nlink == 1


def test_compact_shares_the_files_of_versions_registered_before(project_store, monkeypatch, tmp_path, capsys):
    """`uamt registry compact` on a store whose versions were registered with full copies."""
    import mlflow
    from uamt.cli import main

    class Constant(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return pd.DataFrame({"mu": [0.0] * len(model_input)})

    blob = write(tmp_path / "blob.bin", os.urandom(2 << 20))
    monkeypatch.setattr(shared_files, "MIN_BYTES", 1 << 40)  # as registering did before sharing existed
    register_versions(project_store, "uamt-compact", Constant(), blob, 3)
    stored = sorted((tmp_path / "mlflow" / "artifacts").rglob("blob.bin"))
    assert len(stored) == 3 and {path.stat().st_nlink for path in stored} == {1}
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["registry", "compact"]) == 0
    out = capsys.readouterr().out
    assert "3 model folders; 4 MB of identical files now stored once (hard links)" in out
    assert len({inode(path) for path in stored}) == 1 and stored[0].stat().st_nlink == 4
    assert main(["registry", "compact"]) == 0 and "0 MB" in capsys.readouterr().out  # idempotent
    loaded = mlflow.pyfunc.load_model("models:/uamt-compact/1")
    assert loaded.predict(pd.DataFrame({"x": [1]}))["mu"].tolist() == [0.0]


def test_compact_refuses_a_missing_store(tmp_path, monkeypatch, capsys):
    from uamt.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["registry", "compact"]) == 2
    assert "mlflow.db" in capsys.readouterr().err
