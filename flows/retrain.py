"""Prefect flow ``uamt-retrain``: new human annotations in -> validated, pooled, retrained, registered.

One tick (see docs/orchestration.md):

1. list ``incoming.dir`` for ``.csv/.tsv/.jsonl/.parquet`` files; none and no pending-retrain
   marker -> return at once (``status: no new annotations``), without taking the lock or touching
   anything;
2. take the ``fcntl`` lock ``incoming.lock_path`` (a second retrain waits ``lock_timeout_s`` and
   then returns ``status: busy``); remove the temp folders of killed trainings (``models/.<name>.tmp-<pid>-*``
   of processes that no longer run);
3. task ``ingest`` = :func:`uamt.ingest.ingest_incoming`: validate, append good files to the
   pool atomically (after writing the pending-retrain marker ``incoming.pending_path``), move files
   to ``processed/`` or ``rejected/`` (+ ``.report.txt``);
4. no marker (nothing added, now or by an unfinished earlier tick) -> return ``status: nothing
   ingested``; else retrain from ``prepare`` to ``register``: ``incoming.retrain_with: flow`` runs
   the stage tasks of :mod:`flows.pipeline` as a sub-flow (cached, so unchanged stages are
   skipped); ``dvc`` runs ``dvc repro register`` in a subprocess so ``dvc.lock`` stays in step with
   the outputs (requires the pool file as a dep of the ``prepare`` stage in dvc.yaml);
5. once ``register`` has finished, remove the marker.  A tick that dies before (killed, a stage
   failing) leaves it, so the next tick finishes the retrain (``resumed: true``) even with no new
   file: rows ingested are never left untrained;
6. then stages ``evaluate_campaigns`` and ``evaluate_ood``: the per-campaign and out-of-domain
   numbers, which no gate reads, attached to the versions just registered.

``prepare`` puts pool rows into ``d_q`` (or ``d_e`` when they share a document/sentence with a
``d_e`` component) and drops, with a count in ``data/prepared/summary.json``, those that share one
with dev/test/ood, so the test set stays fixed (:func:`uamt.data.prepare.place_pool_rows`).

Run as a deployment: ``python -m flows.retrain [--params params.yaml]`` serves it as
``uamt-retrain`` every ``incoming.interval_minutes``.  Without ``PREFECT_API_URL``, :func:`main`
starts a Prefect API server itself (``prefect server start``), in its own session (Ctrl-C stops
the flow, not the server, so the flow's end is recorded and the process exits at once) and tied to
this process (it gets SIGTERM when this process dies, even by SIGKILL: no orphaned server);
Prefect's telemetry is off (``PREFECT_SERVER_ANALYTICS_ENABLED=false``, ``DO_NOT_TRACK=1``), as it
fails offline.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task

from flows.pipeline import AFTER_REGISTER, run_pipeline
from uamt import ingest as incoming
from uamt.core.config import DEFAULT_PARAMS, ConfigError, load_section
from uamt.data.prepare import PrepareConfig
from uamt.models.api import recover_stale
from uamt.pipeline_config import load_pipeline
from uamt.registry.store import SUMMARY_PATH

ingest = task(name="ingest", persist_result=False)(incoming.ingest_incoming)


def _dvc_repro(params: str, pool_path: str) -> None:
    """Version the pool (``dvc add``), then ``dvc repro register`` (prepare sees the changed pool)."""
    if Path(params) != Path("params.yaml"):
        raise ConfigError(
            f"{params}: incoming.retrain_with=dvc runs `dvc repro`, which reads params.yaml only"
        )
    subprocess.run(["dvc", "add", pool_path], check=True)
    subprocess.run(["dvc", "repro", "register"], check=True)


def _complete_registered(params: str, retrain_with: str) -> None:
    """The stages after ``register`` (:data:`~flows.pipeline.AFTER_REGISTER`): the per-campaign and
    out-of-domain numbers (no gate reads them) attached to the versions just registered
    (``dvc repro evaluate_campaigns evaluate_ood``, or their Prefect tasks)."""
    if retrain_with == "dvc":
        subprocess.run(["dvc", "repro", *AFTER_REGISTER], check=True)
    else:
        run_pipeline(params, start=AFTER_REGISTER[0], stop=AFTER_REGISTER[-1])


dvc_repro = task(name="dvc_repro", persist_result=False)(_dvc_repro)


def check_pool_wiring(params: str) -> incoming.IncomingConfig:
    """The ``incoming`` config, after checking ``prepare`` reads the pool ``incoming`` writes."""
    cfg = incoming.load_config(params)
    prep = load_section(PrepareConfig, "prepare", params)
    if prep.annotations_pool is None or Path(prep.annotations_pool) != Path(cfg.pool_path):
        raise ConfigError(
            f"{params}: prepare.annotations_pool ({prep.annotations_pool!r}) must equal incoming.pool_path "
            f"({cfg.pool_path!r}), or new annotations would never reach training"
        )
    return cfg


def remove_stale_temp_folders(params: str) -> list[str]:
    """Temp folders of trainings killed mid-write (``models/.<name>.tmp-<pid>-*``, pid not running).

    :func:`uamt.models.api.recover_stale` for every model the pipeline trains (it also puts back a
    previous model a kill left at ``.<name>.old-<pid>``); returns the paths removed or restored.
    """
    pipe = load_pipeline(params)
    touched = []
    for method in pipe.all_methods:
        touched += [str(p) for p in recover_stale(pipe.model_dir(method))]
    return touched


@flow(name="uamt-retrain", log_prints=True)
def retrain_on_new_annotations(params: str = str(DEFAULT_PARAMS)) -> dict[str, Any]:
    """One tick of the scheduled retrain; returns ``status`` and what was done."""
    cfg = check_pool_wiring(params)
    waiting = incoming.new_files(cfg.dir)
    if not waiting and incoming.read_pending(cfg) is None:
        print(f"no new annotations in {cfg.dir}")
        return {"status": "no new annotations"}
    try:
        with incoming.retrain_lock(cfg.lock_path, cfg.lock_timeout_s):
            owed = incoming.read_pending(cfg)  # under the lock: an unfinished earlier retrain
            cleaned = remove_stale_temp_folders(params)
            if cleaned:
                print(f"removed temp folders of killed trainings: {cleaned}")
            result = ingest(cfg)
            summary: dict[str, Any] = {"ingest": asdict(result)}
            if cleaned:
                summary["cleaned"] = cleaned
            if incoming.read_pending(cfg) is None:
                print(f"nothing ingested: rejected {result.rejected}, reports {result.reports}")
                return {"status": "nothing ingested", **summary}
            if owed is not None:
                summary["resumed"] = True
                print(f"finishing the retrain owed since {owed.get('since')}: {owed.get('changes')}")
            if result.changed:
                print(f"ingested {result.rows_added} row(s) from {result.ingested}; retraining")
            if cfg.retrain_with == "dvc":
                dvc_repro(params, cfg.pool_path)
            else:
                run_pipeline(params, start="prepare", stop="register")
            summary["registry"] = json.loads(SUMMARY_PATH.read_text(encoding="utf-8"))
            incoming.clear_pending(cfg)  # only now: register has finished
            # After the marker: a failure here leaves the new champion registered, owed nothing
            # but these numbers (the next `dvc repro` measures them), never a second registration.
            _complete_registered(params, cfg.retrain_with)
            return {"status": "retrained", **summary}
    except incoming.RetrainBusy as exc:
        print(str(exc))
        return {"status": "busy"}


#: Prefect settings for offline runs: its telemetry posts to the internet and logs an ERROR when it cannot.
QUIET_PREFECT_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
}


def _die_with_parent(parent: int):
    """``preexec_fn`` for the API server: SIGTERM when ``parent`` dies (Linux ``PR_SET_PDEATHSIG``)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here, in the parent, not after fork
    except OSError:  # pragma: no cover - not Linux/glibc: the server is only detached
        libc = None

    def preexec() -> None:
        if libc is not None and hasattr(libc, "prctl"):
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: do not outlive it
            os._exit(1)

    return preexec


@dataclass
class ApiServer:
    """A Prefect API server this process started; :meth:`stop` (also run at exit) ends it."""

    server_process: subprocess.Popen
    api_url: str

    def stop(self) -> None:
        if self.server_process.poll() is None:
            self.server_process.terminate()
            try:
                self.server_process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server_process.kill()
                self.server_process.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_api_server() -> ApiServer | None:
    """Start a Prefect API server for this process (when no ``PREFECT_API_URL`` is set) that survives
    Ctrl-C and dies with this process; point this process's Prefect client at it.

    Left to itself, prefect 3.8 starts a temporary server lazily, from whichever thread first needs
    the API, in the terminal's process group: Ctrl-C (SIGINT to the group) killed it while the flow
    went on and then retried the dead API for minutes, and a SIGKILLed flow left it running.  Prefect
    has no setting for how that subprocess is started (``server.ephemeral`` holds only ``enabled``
    and ``startup_timeout_seconds``), so this runs what Prefect documents for a dedicated server,
    ``prefect server start`` (in-process uvicorn, one process), with ``PREFECT_API_URL`` pointing at
    it: from the main thread (``PR_SET_PDEATHSIG`` follows the thread that forks), in its own session,
    waiting up to ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` for its health check.
    Returns the server, or None when an API URL is configured.
    """
    import httpx
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    if PREFECT_API_URL.value():
        return None
    port = _free_port()
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--no-ui", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    server = ApiServer(process, f"http://127.0.0.1:{port}/api")
    atexit.register(server.stop)
    deadline = time.monotonic() + PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"{shlex.join(command)} exited with code {process.returncode} before answering"
            )
        try:
            if httpx.get(f"{server.api_url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass  # not listening yet: poll again until the deadline
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(
                f"{shlex.join(command)} did not answer {server.api_url}/health within "
                f"{PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()} s "
                "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
            )
        time.sleep(0.2)
    # This process's Prefect client, and the processes it starts (flow runs of `serve`), use it.
    os.environ["PREFECT_API_URL"] = server.api_url
    _SETTINGS.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url}))
    return server


#: Holds the settings that point this process's Prefect client at the server it started.
_SETTINGS = contextlib.ExitStack()


def _sigterm_as_exit(signum, frame) -> None:  # pragma: no cover - exercised by a subprocess
    raise SystemExit(128 + signum)  # unwinds: Prefect records the run as crashed, atexit stops the server


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - starts a long-running server
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flows.retrain", description="serve uamt-retrain")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--once", action="store_true", help="run one tick now instead of serving")
    args = parser.parse_args(argv)
    for key, value in QUIET_PREFECT_ENV.items():
        os.environ.setdefault(key, value)
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    start_api_server()
    if args.once:
        print(retrain_on_new_annotations(args.params))
        return
    cfg = check_pool_wiring(args.params)
    retrain_on_new_annotations.serve(
        name="uamt-retrain",
        interval=cfg.interval_minutes * 60,
        parameters={"params": args.params},
        tags=["uamt", "retrain"],
    )


if __name__ == "__main__":  # pragma: no cover
    main()
