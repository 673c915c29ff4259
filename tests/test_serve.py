"""The REST server on loopback, for real: good requests, every bad request, concurrency."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_scoring_support import QE_MODEL, REF_MODEL, fake_mu_ref, fake_sigma

from uamt.predictor import load_predictor
from uamt.serve import ScoringService, ServeSettings, make_server

SETTINGS = ServeSettings(max_batch=8, max_chars=200, max_body_bytes=20_000, max_refs=4, max_pairs=12)
RECORDS = [
    {"src": "Der Hund schläft.", "mt": "The dog sleeps.", "ref": "The dog is sleeping."},
    {"src": "Das Wetter ist schön.", "mt": "The weather is nice.", "ref": "The weather is beautiful."},
]


# Every test runs against the fake scoring models' store (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("scoring_tracking")


def _start(service: ScoringService):
    server = make_server(service, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="module")
def ref_server(scoring_store):
    os.environ["MLFLOW_TRACKING_URI"] = scoring_store  # module scope: monkeypatch is per test
    uri = f"models:/{REF_MODEL}@champion"
    service = ScoringService(load_predictor(uri), uri, SETTINGS)
    server, thread = _start(service)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def qe_server(scoring_store):
    os.environ["MLFLOW_TRACKING_URI"] = scoring_store
    uri = f"models:/{QE_MODEL}@champion"
    server, thread = _start(ScoringService(load_predictor(uri), uri, SETTINGS))
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def request(server, method, path, body=None, headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        response = conn.getresponse()
        data = response.read()
        return response.status, data
    finally:
        conn.close()


def _expected(records):
    mus = [fake_mu_ref(r["mt"], r["refs"] if "refs" in r else [r["ref"]]) for r in records]
    return np.array(mus), np.array([fake_sigma(r["mt"]) for r in records])


def _check_predictions(data, records):
    predictions = json.loads(data)["predictions"]
    assert len(predictions) == len(records)
    mu, sigma = _expected(records)
    np.testing.assert_allclose([p["mu"] for p in predictions], mu)
    np.testing.assert_allclose([p["sigma"] for p in predictions], sigma)
    for p in predictions:
        assert {"mu", "sigma", "lower", "upper", "risk", "epistemic_var", "aleatoric_var"} <= set(p)
        assert p["lower"] < p["mu"] < p["upper"] and 0.0 <= p["risk"] <= 1.0


def test_good_request_all_input_formats(ref_server):
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": RECORDS})
    assert status == 200
    _check_predictions(data, RECORDS)
    columns = ["src", "mt", "ref"]
    split = {"dataframe_split": {"columns": columns, "data": [[r[c] for c in columns] for r in RECORDS]}}
    assert request(ref_server, "POST", "/invocations", split)[1] == data
    assert request(ref_server, "POST", "/invocations", {"inputs": RECORDS})[1] == data
    as_columns = {"inputs": {c: [r[c] for r in RECORDS] for c in columns}}
    assert request(ref_server, "POST", "/invocations?x=1", as_columns)[1] == data


def test_language_pair_is_passed_through(ref_server):
    records = [{**r, "lp": "de-en"} for r in RECORDS]
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": records})
    assert status == 200
    _check_predictions(data, RECORDS)
    frame = ref_server.RequestHandlerClass.service.parse({"dataframe_records": records})
    assert frame["lp"].tolist() == ["de-en", "de-en"]


def test_several_references_are_averaged(ref_server):
    records = [
        {"src": "a b", "mt": "The cat sat.", "refs": ["The cat sat down.", "A cat was sitting."]},
        RECORDS[0],
    ]
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": records})
    assert status == 200
    _check_predictions(data, records)


def test_health_ping_version(ref_server):
    status, data = request(ref_server, "GET", "/health")
    health = json.loads(data)
    assert status == 200 and health["status"] == "ok"
    assert health["model"] == f"models:/{REF_MODEL}@champion" and health["scale"] == "fake-chrF"
    assert health["uses_references"] is True and health["risk_threshold"] == 0.3
    assert request(ref_server, "GET", "/ping") == (200, b"\n")
    status, data = request(ref_server, "GET", "/version")
    version = json.loads(data)
    assert status == 200 and version["uamt"] and version["mlflow"] and version["method"] == "fake-chrf"


def _big(n):
    return "x" * n


BAD_REQUESTS = {
    "not json": (b"{not json", {}, 400, "not valid JSON"),
    "not utf-8": (b'{"inputs": ["\xff"]}', {}, 400, "not UTF-8"),
    "json list": (b"[1, 2]", {}, 400, "JSON object"),
    "no format key": ({"records": RECORDS}, {}, 400, "unknown top-level key"),
    "model path from client": (
        {"dataframe_records": RECORDS, "model": "/etc"},
        {},
        400,
        "unknown top-level key",
    ),
    "two format keys": ({"dataframe_records": RECORDS, "inputs": RECORDS}, {}, 400, "exactly one"),
    "missing field": (
        {"dataframe_records": [{"src": "a", "ref": "b"}]},
        {},
        400,
        "record 0: missing field 'mt'",
    ),
    "wrong type": (
        {"dataframe_records": [{"src": "a", "mt": 3, "ref": "b"}]},
        {},
        400,
        "record 0.mt must be a string",
    ),
    "refs not a list": (
        {"dataframe_records": [{"src": "a", "mt": "b", "refs": "c"}]},
        {},
        400,
        "refs must be",
    ),
    "record not object": ({"dataframe_records": ["a"]}, {}, 400, "record 0 must be an object"),
    "unknown field": (
        {"dataframe_records": [{"src": "a", "mt": "b", "reference": "c"}]},
        {},
        400,
        "unknown field",
    ),
    "empty text": (
        {"dataframe_records": [{"src": " ", "mt": "b", "ref": "c"}]},
        {},
        400,
        "record 0.src is empty",
    ),
    "missing ref": (
        {"dataframe_records": [RECORDS[0], {"src": "a", "mt": "b"}]},
        {},
        400,
        "record 1: this model is reference-based",
    ),
    "lp on some records only": (
        {"dataframe_records": [{**RECORDS[0], "lp": "de-en"}, RECORDS[1]]},
        {},
        400,
        "not on records [1]",
    ),
    "lp wrong type": ({"dataframe_records": [{**RECORDS[0], "lp": 7}]}, {}, 400, "record 0.lp must be"),
    "empty batch": ({"dataframe_records": []}, {}, 400, "empty batch"),
    "batch too big": ({"dataframe_records": RECORDS * 5}, {}, 413, "over the limit of 8"),
    # One record with thousands of references used to hold the model lock for 22 s.
    "too many references": (
        {"dataframe_records": [{"src": "a", "mt": "b", "refs": ["c"] * 2000}]},
        {},
        413,
        "record 0.refs has 2000 references, over the limit of 4 per record",
    ),
    "too much work per request": (
        {"dataframe_records": [{"src": "a", "mt": "b", "refs": ["c", "d", "e", "f"]}] * 4},
        {},
        413,
        "16+ (segment, reference) scoring passes by record 3, over the limit of 12",
    ),
    "segment too long": (
        {"dataframe_records": [{"src": "a", "mt": _big(201), "ref": "c"}]},
        {},
        413,
        "201 characters",
    ),
    "body too big": (
        {"dataframe_records": [{"src": _big(30_000), "mt": "b", "ref": "c"}]},
        {},
        413,
        "over the limit of 20000 bytes",
    ),
    "bad split": (
        {"dataframe_split": {"columns": ["src", "mt"], "data": [["a"]]}},
        {},
        400,
        "data[0] must be a list of 2",
    ),
    "wrong content type": (
        {"dataframe_records": RECORDS},
        {"Content-Type": "text/csv"},
        415,
        "application/json",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_gets_4xx_and_server_stays_up(ref_server, case):
    body, headers, expected_status, needle = BAD_REQUESTS[case]
    status, data = request(ref_server, "POST", "/invocations", body, headers)
    assert status == expected_status, data
    error = json.loads(data)
    assert needle in error["error"] and error["status"] == expected_status
    assert request(ref_server, "GET", "/ping")[0] == 200
    ok_status, ok = request(ref_server, "POST", "/invocations", {"dataframe_records": RECORDS})
    assert ok_status == 200
    _check_predictions(ok, RECORDS)


def test_wrong_paths_and_methods(ref_server):
    assert request(ref_server, "GET", "/nope")[0] == 404
    assert request(ref_server, "GET", "/invocations")[0] == 405
    assert request(ref_server, "POST", "/health", {"inputs": RECORDS})[0] == 404
    assert request(ref_server, "DELETE", "/invocations")[0] == 405
    assert request(ref_server, "GET", "/ping")[0] == 200


def test_qe_server_refuses_references(qe_server):
    status, data = request(qe_server, "POST", "/invocations", {"dataframe_records": RECORDS})
    assert status == 400 and "reference-free" in json.loads(data)["error"]
    plain = [{"src": r["src"], "mt": r["mt"]} for r in RECORDS]
    status, data = request(qe_server, "POST", "/invocations", {"dataframe_records": plain})
    assert status == 200 and len(json.loads(data)["predictions"]) == 2


def test_twenty_concurrent_clients(ref_server):
    def client(k):
        records = [
            {
                "src": f"Satz {k} {j}",
                "mt": f"Sentence number {k} and {j}.",
                "ref": f"This is sentence {k}, part {j}.",
            }
            for j in range(1 + k % 4)
        ]
        status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": records})
        return status, data, records

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(client, range(20)))
    for status, data, records in results:
        assert status == 200
        _check_predictions(data, records)


def test_model_calls_are_serialised(scoring_store):
    uri = f"models:/{REF_MODEL}@champion"
    predictor = load_predictor(uri)
    inner = predictor.predict_frame
    active, peak, guard = [0], [0], threading.Lock()

    def slow_predict(frame, **kwargs):
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with guard:
            active[0] -= 1
        return inner(frame, **kwargs)

    predictor.predict_frame = slow_predict
    server, thread = _start(ScoringService(predictor, uri, SETTINGS))
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(
                pool.map(lambda _: request(server, "POST", "/invocations", {"inputs": RECORDS})[0], range(8))
            )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert statuses == [200] * 8
    assert peak[0] == 1


def test_uamt_serve_command(scoring_store, tmp_path):
    """`uamt serve --port 0` in a subprocess: loads the model once, binds loopback, answers."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": scoring_store, "PYTHONPATH": str(Path(__file__).parent)}
    script = Path(sys.executable).parent / "uamt"
    launcher = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from uamt.cli import main; sys.exit(main())"]
    )
    argv = [
        *launcher,
        "serve",
        "--port",
        "0",
        "--params",
        str(tmp_path / "none.yaml"),
        "--model",
        f"models:/{QE_MODEL}@champion",
    ]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "http://" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line

        class _Addr:
            server_address = ("127.0.0.1", int(match.group(1)))

        assert request(_Addr, "GET", "/ping")[0] == 200
        status, data = request(_Addr, "POST", "/invocations", {"inputs": [{"src": "abc", "mt": "abcd"}]})
        assert status == 200 and json.loads(data)["predictions"][0]["mu"] == pytest.approx(0.75)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()


def test_uamt_serve_missing_model_is_a_clear_error(scoring_store, tmp_path, capsys):
    from uamt.cli import main

    params = tmp_path / "params.yaml"
    params.write_text("register:\n  model_name: uamt-absent\n", encoding="utf-8")
    assert main(["serve", "--params", str(params), "--port", "0"]) == 2
    assert "could not load model 'models:/uamt-absent@champion'" in capsys.readouterr().err
