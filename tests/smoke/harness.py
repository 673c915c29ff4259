"""The README's ``make run`` on the smoke profile, in a throw-away clone of the committed tree.

:func:`prepare_clone` clones a commit of this repository, merges ``params.smoke.yaml`` onto the
clone's ``params.yaml`` (:func:`smoke_params`), cuts the clone's ``data_sources.yaml`` to the smoke
profile's files (:func:`keep_files`) and returns the environment a fresh user would run
``make run`` in: offline, the data mirror named by ``UAMT_DATA_MIRROR``, no ``MLFLOW_TRACKING_URI``
(the Makefile's default, the clone's own ``mlflow/``), the clone's code first on ``PYTHONPATH``, and
the Python environment running this code as the Makefile's ``VENV`` (``make -o`` keeps ``make`` from
reinstalling it: nothing is downloaded and no environment is created per run).

Used by the session fixture ``smoke`` of ``tests/conftest.py`` (one clone, one ``make run``, read by
``tests/test_smoke_make_run.py`` and ``tests/test_pipeline_e2e.py``) and by
``tests/test_smoke_finetune.py``; by hand (the before/after of a fix, timings)::

    python -m tests.smoke.harness /tmp/smoke [--commit REV] [--runs 2] [--overlay more-params.yaml]
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERLAY = Path(__file__).with_name("params.smoke.yaml")
#: Bounds a hung stage only: ``make run`` of the smoke profile took 10 min on 2 shared cores at a load
#: average of 4-6, 40 min at 11-18 (see tests/test_smoke_make_run.py for the figures).
MAKE_RUN_TIMEOUT_S = 3600


def merge(base: dict, overlay: dict) -> dict:
    """``base`` with ``overlay`` merged onto it: mappings key by key, any other value replaced (a key
    no stage knows is refused by the stage's config, naming ``params.yaml:<section>.<key>``)."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def keep_files(pins: dict[str, dict], globs_by_repo: dict[str, list[str]]) -> dict[str, dict]:
    """The pins of ``data_sources.yaml`` (repository -> commit, files) cut to the repositories of
    ``globs_by_repo`` and their files matching a glob."""
    kept = {}
    for repo, pinned in pins.items():
        globs = globs_by_repo.get(repo)
        if globs is None:
            continue
        files = {
            path: sha for path, sha in pinned["files"].items() if any(fnmatch.fnmatch(path, g) for g in globs)
        }
        if not files:
            raise ValueError(f"{OVERLAY}: smoke.fetch_files[{repo!r}] matches no pinned file")
        kept[repo] = {**pinned, "files": files}
    missing = set(globs_by_repo) - set(kept)
    if missing:
        raise ValueError(f"{OVERLAY}: smoke.fetch_files names repositories not pinned: {sorted(missing)}")
    return kept


def smoke_params(params: dict, overlay: dict) -> dict:
    """The smoke profile: ``params`` with ``overlay`` merged on (its ``smoke:`` instructions left out)."""
    overlay = {key: value for key, value in overlay.items() if key != "smoke"}
    unknown = set(overlay) - set(params)
    if unknown:
        raise ValueError(f"{OVERLAY}: sections not in params.yaml: {sorted(unknown)}")
    return merge(params, overlay)


def venv_root() -> Path:
    """The virtual environment running this code (CI: the clone's ``.venv`` that ``make test`` made)."""
    root = Path(sys.prefix)
    missing = [name for name in ("python", "uamt", "dvc") if not (root / "bin" / name).exists()]
    if sys.prefix == sys.base_prefix or missing:
        raise RuntimeError(
            f"{root} is not the project's virtual environment (missing {missing or 'a venv'}); run the "
            "tests with .venv/bin/python (make test)"
        )
    return root


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def clone(dest: Path, commit: str = "HEAD") -> str:
    """``git clone`` this repository into ``dest`` at ``commit`` (the committed tree, not the working
    tree); returns the commit's hash."""
    sha = git("rev-parse", "--verify", f"{commit}^{{commit}}")
    git("clone", "--quiet", "--no-checkout", str(REPO_ROOT), str(dest))
    git("checkout", "--quiet", "--detach", sha, cwd=dest)
    return sha


def environment(checkout: Path, mirror: Path) -> dict[str, str]:
    """What a fresh user's shell holds for ``make run`` in ``checkout``: nothing of this session's
    MLflow / Prefect / Python settings; offline; the mirror; the checkout's code first."""
    env = {
        key: value
        for key, value in os.environ.items()
        # (under `make test` the outer make exports its MLflow/Prefect settings and MAKEFLAGS)
        if not key.startswith(("MLFLOW_", "PREFECT_", "UAMT_", "DVC_"))
        and key not in ("PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }
    env.update(
        PYTHONPATH=f"{checkout / 'src'}{os.pathsep}{checkout}",
        UAMT_DATA_MIRROR=str(mirror),
        UAMT_CACHE_DIR=str(checkout / ".uamt-cache"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PATH=f"{venv_root() / 'bin'}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def prepare_clone(dest: Path, mirror: Path, commit: str = "HEAD", extra: dict | None = None) -> dict[str, str]:
    """Clone ``commit`` into ``dest`` with the smoke profile as its params.yaml and its pins cut to
    the profile's files; ``extra`` (params sections) is merged on last, e.g. the GPU settings of
    docs/models.md.  Returns the environment."""
    clone(dest, commit)
    params_path = dest / "params.yaml"
    params = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    overlay = yaml.safe_load(OVERLAY.read_text(encoding="utf-8"))
    params = smoke_params(params, merge(overlay, extra or {}))
    globs_by_repo = (overlay.get("smoke") or {}).get("fetch_files")
    if globs_by_repo is not None:
        pins_path = dest / params["fetch"].get("sources_file", "data_sources.yaml")
        pins = yaml.safe_load(pins_path.read_text(encoding="utf-8"))
        pins_path.write_text(
            yaml.safe_dump(keep_files(pins, globs_by_repo), sort_keys=False), encoding="utf-8"
        )
    params_path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return environment(dest, mirror)


def make_run(checkout: Path, env: dict[str, str], log: Path) -> tuple[int, float, str]:
    """``make run`` in ``checkout`` (the environment reused, not reinstalled); returns its exit code,
    seconds and output (also written to ``log``)."""
    venv = venv_root()
    command = ["make", "--no-print-directory", "-o", f"{venv}/.installed", "run", f"VENV={venv}"]
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:  # written as it runs: `tail -f` shows the stage
        # Its own process group: on a timeout dvc and the stage it runs are ended too, not only make.
        proc = subprocess.Popen(
            command, cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=MAKE_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    seconds = time.monotonic() - start
    return code, seconds, log.read_text(encoding="utf-8")


def uamt(checkout: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``uamt ARGS`` in ``checkout`` with the Makefile's tracking URI (its ``mlflow/``), as after ``make run``."""
    env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{checkout.resolve() / 'mlflow' / 'mlflow.db'}"}
    return subprocess.run(
        [str(venv_root() / "bin" / "uamt"), *args], cwd=checkout, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


#: Two en-de segments (a language pair the smoke models are trained and calibrated on) for ``uamt score``.
SEGMENTS = {
    "src": ["The weather is nice today.", "He bought three apples at the market."],
    "mt": ["Das Wetter ist heute schön.", "Er kaufte drei Äpfel."],
    "ref": ["Heute ist das Wetter schön.", "Er hat auf dem Markt drei Äpfel gekauft."],
}


def score_segments(checkout: Path, env: dict[str, str], with_refs: bool) -> subprocess.CompletedProcess:
    """``uamt score`` of :data:`SEGMENTS` (written beside ``checkout``; without references: the QE
    champion answers) with ``--lp en-de``."""
    files = []
    for column, lines in SEGMENTS.items():
        if column == "ref" and not with_refs:
            continue
        path = checkout.parent / f"segments.{column}"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        files += [f"--{column}", str(path)]
    return uamt(checkout, env, "score", *files, "--lp", "en-de", "--no-progress")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder to clone into (must not exist)")
    parser.add_argument("--commit", default="HEAD", help="commit of this repository to clone (default HEAD)")
    parser.add_argument("--runs", type=int, default=1, help="how many times to run make run")
    parser.add_argument(
        "--mirror", type=Path, default=None, help="data mirror (default: as the tests find it)"
    )
    parser.add_argument(
        "--overlay", type=Path, default=None, help="a YAML file of params sections merged on after the smoke profile"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from conftest import find_mirror

    extra = yaml.safe_load(args.overlay.read_text(encoding="utf-8")) if args.overlay else None
    env = prepare_clone(args.dest, args.mirror or find_mirror(), args.commit, extra)
    for run in range(1, args.runs + 1):
        code, seconds, _ = make_run(args.dest, env, args.dest / f"make-run-{run}.log")
        print(f"make run #{run}: exit {code} in {seconds:.0f} s (log {args.dest / f'make-run-{run}.log'})")
        for name in ("uamt-comet", "uamt-comet-qe"):
            shown = uamt(args.dest, env, "registry", "show", "--name", name)
            print(f"uamt registry show --name {name}: exit {shown.returncode}\n{shown.stdout}{shown.stderr}")
        if code:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
