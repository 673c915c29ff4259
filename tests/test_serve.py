"""The REST server (FastAPI on uvicorn) on loopback, for real: good requests, every bad request,
concurrency, and the HTTP attacks of the round-2 reliability issue (item 16: slow clients, request
smuggling, conflicting or lying ``Content-Length``, oversized bodies)."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_scoring_support import (
    QE_MODEL,
    REF_MODEL,
    FakePredictor,
    fake_mu_ref,
    fake_sigma,
    running_server,
)

from uamt.serving.predictor import load_predictor
from uamt.serving.rest import ScoringService, ServeSettings

# Short deadlines, so that the slow-client cases take a second, not the production 10 s / 30 s.
SETTINGS = ServeSettings(
    max_batch=8,
    max_chars=200,
    max_body_bytes=20_000,
    max_refs=4,
    max_pairs=12,
    header_timeout_s=1.0,
    body_timeout_s=1.0,
)
RECORDS = [
    {"src": "Der Hund schläft.", "mt": "The dog sleeps.", "ref": "The dog is sleeping."},
    {"src": "Das Wetter ist schön.", "mt": "The weather is nice.", "ref": "The weather is beautiful."},
]


# Every test runs against the fake scoring models' store (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("scoring_tracking")


@pytest.fixture(scope="module")
def ref_server(scoring_store):
    os.environ["MLFLOW_TRACKING_URI"] = scoring_store  # module scope: monkeypatch is per test
    uri = f"models:/{REF_MODEL}@champion"
    with running_server(ScoringService(load_predictor(uri), uri, SETTINGS, {"name": REF_MODEL})) as server:
        yield server


@pytest.fixture(scope="module")
def qe_server(scoring_store):
    os.environ["MLFLOW_TRACKING_URI"] = scoring_store
    uri = f"models:/{QE_MODEL}@champion"
    with running_server(ScoringService(load_predictor(uri), uri, SETTINGS)) as server:
        yield server


class FakeLpPredictor(FakePredictor):
    """The fake, declaring the language pairs it knows as a uamt pyfunc does."""

    language_pairs = {"de-en": "per-lp", "en-de": "global"}


@pytest.fixture(scope="module")
def lp_server():
    with running_server(ScoringService(FakeLpPredictor(), "fake-lp", SETTINGS)) as server:
        yield server


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


FLAG_CASES = {
    # params -> (chi of the flag or None, max_risk, flag_risk column expected); the fake's own
    # risk threshold is 0.3, and RECORDS hold one likely bad translation at chi = 0.45 and 0.3.
    "no params": (None, None, None, False),
    "empty params": ({}, None, None, False),
    "flag at the risk threshold": ({"flag_below": 0.3, "max_risk": 0.05}, 0.3, 0.05, False),
    "flag at its own threshold, default max_risk": ({"flag_below": 0.45}, 0.45, 0.5, True),
    "flag at its own threshold": ({"flag_below": 0.45, "max_risk": 0.2}, 0.45, 0.2, True),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_params_flag_predictions_from_the_served_risk(ref_server, case):
    from uamt.uncertainty.metrics import translation_risk

    params, chi, max_risk, with_flag_risk = FLAG_CASES[case]
    body = {"dataframe_records": RECORDS, **({} if params is None else {"params": params})}
    status, data = request(ref_server, "POST", "/invocations", body)
    assert status == 200, data
    _check_predictions(data, RECORDS)
    predictions = json.loads(data)["predictions"]
    mu, sigma = _expected(RECORDS)
    if chi is None:
        assert not {"flagged", "flag_risk"} & {k for p in predictions for k in p}
        return
    risk_at_chi = translation_risk(mu, sigma, chi)
    assert [p["flagged"] for p in predictions] == [True, False] == list(risk_at_chi > max_risk)
    if with_flag_risk:
        np.testing.assert_allclose([p["flag_risk"] for p in predictions], risk_at_chi)
        np.testing.assert_allclose([p["risk"] for p in predictions], translation_risk(mu, sigma, 0.3))
    else:
        assert not any("flag_risk" in p for p in predictions)
    columns = ["src", "mt", "ref"]
    split = {"dataframe_split": {"columns": columns, "data": [[r[c] for c in columns] for r in RECORDS]}}
    assert request(ref_server, "POST", "/invocations", {**split, "params": params})[1] == data


@pytest.mark.parametrize("flag_below, status", [(None, 200), (0.3, 200), (0.45, 413)])
def test_flag_at_another_threshold_counts_its_second_pass_as_work(flag_below, status):
    from dataclasses import replace

    from uamt.serving.rest import RequestError, scoring_work

    work = scoring_work([r["src"] for r in RECORDS], [r["mt"] for r in RECORDS], [[r["ref"]] for r in RECORDS])
    service = ScoringService(FakePredictor(), "fake", replace(SETTINGS, max_work_chars=work))  # threshold 0.3
    body = {"dataframe_records": RECORDS, **({} if flag_below is None else {"params": {"flag_below": flag_below}})}
    if status == 200:
        assert len(service.invocations(json.dumps(body).encode())["predictions"]) == len(RECORDS)
    else:
        with pytest.raises(RequestError, match=f"needs {2 * work:,} characters of scoring work"):
            service.invocations(json.dumps(body).encode())


def test_language_pair_is_passed_through(ref_server):
    records = [{**r, "lp": "de-en"} for r in RECORDS]
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": records})
    assert status == 200
    _check_predictions(data, RECORDS)
    frame = ref_server.service.parse({"dataframe_records": records})
    assert frame["lp"].tolist() == ["de-en", "de-en"]


def test_a_campaign_is_passed_through_to_the_model(ref_server):
    """The model routes it (tests/test_campaigns.py: a uamt model refuses a campaign it has no
    calibration for); the server checks only that it is a name."""
    records = [{**r, "lp": "de-en", "campaign": "wmt21_mqm"} for r in RECORDS]
    frame = ref_server.service.parse({"dataframe_records": records})
    assert frame["campaign"].tolist() == ["wmt21_mqm", "wmt21_mqm"]
    assert "campaign" not in ref_server.service.parse({"dataframe_records": RECORDS}).columns
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": [{**RECORDS[0], "campaign": 7}]})
    assert status == 400 and "record 0.campaign must be a campaign name" in data.decode(), data
    # any name ingestion accepts for a user's raters passes (64 characters); a key separator does not
    user = "acme-raters_2026." + "x" * 47
    assert ref_server.service.parse({"dataframe_records": [{**RECORDS[0], "campaign": user}]})["campaign"].tolist() == [user]
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": [{**RECORDS[0], "campaign": "en-de|acme"}]})
    assert status == 400 and "letters, digits, '_', '-' or '.'" in data.decode(), data


def test_language_pair_picks_and_names_the_calibration(lp_server):
    """Item 17: a known lp says which calibration it got; an unknown one is scored with the global
    calibration and warned about (never silently global)."""
    records = [{**RECORDS[0], "lp": "de-en"}, {**RECORDS[1], "lp": "en-de"}]
    status, data = request(lp_server, "POST", "/invocations", {"dataframe_records": records})
    assert status == 200, data
    answer = json.loads(data)
    assert [p["calibration"] for p in answer["predictions"]] == ["per-lp", "global"]
    assert [p["lp_seen_in_training"] for p in answer["predictions"]] == [True, True]
    assert "warnings" not in answer
    records[1]["lp"] = "xx-yy"
    status, data = request(lp_server, "POST", "/invocations", {"dataframe_records": records})
    assert status == 200, data
    answer = json.loads(data)
    assert [p["calibration"] for p in answer["predictions"]] == ["per-lp", "global"]
    assert [p["lp_seen_in_training"] for p in answer["predictions"]] == [True, False]
    assert answer["warnings"] == [
        "language pair xx-yy was never seen in training (the model knows de-en, en-de): scores are "
        "less reliable and the global calibration is used without widening (the unseen-LP widening fitted for this model is 1)"
    ]
    status, data = request(lp_server, "POST", "/invocations", {"dataframe_records": RECORDS})
    assert status == 200 and "calibration" not in json.loads(data)["predictions"][0]


def test_several_references_are_averaged(ref_server):
    records = [
        {"src": "a b", "mt": "The cat sat.", "refs": ["The cat sat down.", "A cat was sitting."]},
        RECORDS[0],
    ]
    status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": records})
    assert status == 200
    _check_predictions(data, records)


def test_health_ping_version_metadata(ref_server):
    status, data = request(ref_server, "GET", "/health")
    health = json.loads(data)
    assert status == 200 and health["status"] == "ok"
    assert health["model"] == f"models:/{REF_MODEL}@champion" and health["scale"] == "fake-chrF"
    assert health["uses_references"] is True and health["risk_threshold"] == 0.3
    assert request(ref_server, "GET", "/ping") == (200, b"\n")
    status, data = request(ref_server, "GET", "/version")
    version = json.loads(data)
    assert status == 200 and version["uamt"] and version["mlflow"] and version["method"] == "fake-chrf"
    status, data = request(ref_server, "GET", "/metadata")
    metadata = json.loads(data)
    assert status == 200 and metadata["registered_model"] == {"name": REF_MODEL}
    assert metadata["limits"]["max_refs"] == 4 and metadata["limits"]["max_body_bytes"] == 20_000


def test_registered_version_names_version_and_alias():
    from uamt.serving.rest import registered_version

    assert registered_version(f"models:/{REF_MODEL}@champion") == {
        "name": REF_MODEL,
        "version": "1",
        "alias": "champion",
    }
    assert registered_version(f"models:/{REF_MODEL}/1") == {"name": REF_MODEL, "version": "1"}
    assert registered_version("/some/folder") == {}


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
    "params not an object": ({"dataframe_records": RECORDS, "params": [0.3]}, {}, 400, "params must be an object"),
    "unknown param": ({"dataframe_records": RECORDS, "params": {"flag": 0.3}}, {}, 400, "params: unknown field(s) ['flag']"),
    "flag_below a string": (
        {"dataframe_records": RECORDS, "params": {"flag_below": "0.3"}}, {}, 400, "params.flag_below must be a number",
    ),
    "flag_below a bool": (
        {"dataframe_records": RECORDS, "params": {"flag_below": True}}, {}, 400, "params.flag_below must be a number",
    ),
    "flag_below NaN": (
        b'{"dataframe_records": [{"src": "a", "mt": "b", "ref": "c"}], "params": {"flag_below": NaN}}',
        {},
        400,
        "params.flag_below must be a finite number",
    ),
    "flag_below too large for a float": (
        b'{"dataframe_records": [{"src": "a", "mt": "b", "ref": "c"}], "params": {"flag_below": 1' + b"0" * 400 + b"}}",
        {},
        400,
        "params.flag_below must be a finite number",
    ),
    "max_risk above 1": (
        {"dataframe_records": RECORDS, "params": {"flag_below": 0.3, "max_risk": 1.5}},
        {},
        400,
        "params.max_risk must be a probability in [0, 1], got 1.5",
    ),
    "max_risk without flag_below": (
        {"dataframe_records": RECORDS, "params": {"max_risk": 0.2}}, {}, 400, "params.max_risk needs params.flag_below",
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
    # Item 16: each used to be a 500.
    "nested 10k deep": (b"[" * 10_000 + b"]" * 10_000, {}, 400, "nested too deeply"),
    "5000-digit integer": (b'{"inputs": [' + b"9" * 5000 + b"]}", {}, 400, "4300 digits"),
    "lone surrogate": (
        b'{"dataframe_records": [{"src": "a", "mt": "b\\ud800", "ref": "c"}]}',
        {},
        400,
        "record 0.mt is not valid Unicode (lone surrogate U+D800)",
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
    status, data = request(ref_server, "GET", "/nope")
    assert status == 404 and "GET /nope: Not Found; use POST /invocations" in json.loads(data)["error"]
    assert request(ref_server, "GET", "/invocations")[0] == 405
    assert request(ref_server, "POST", "/health", {"inputs": RECORDS})[0] == 405
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
    with running_server(ScoringService(predictor, uri, SETTINGS)) as server:
        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(
                pool.map(lambda _: request(server, "POST", "/invocations", {"inputs": RECORDS})[0], range(8))
            )
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


# ============================================================================ item 16: HTTP attacks
def _raw(server, data: bytes, *, wait: float = 5.0, linger: float | None = None) -> bytes:
    """Send ``data`` on a fresh connection; return every byte the server sends until it closes the
    connection, ``wait`` seconds pass without a byte, or (``linger`` given) ``linger`` seconds after
    the first byte."""
    sock = socket.create_connection(server.server_address, timeout=wait)
    try:
        sock.sendall(data)
        received, end = b"", None
        while end is None or time.monotonic() < end:
            sock.settimeout(wait if end is None else max(end - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            received += chunk
            if end is None and linger is not None:
                end = time.monotonic() + linger
        return received
    finally:
        sock.close()


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def _post_head(length: int, extra: str = "") -> bytes:
    return (
        "POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def test_slow_clients_do_not_block_others_and_are_dropped(ref_server):
    """400 half-sent requests used to hold 400 threads: now they hold no thread, others are served at
    once, and each slow connection is closed when its header (or body) deadline passes."""
    slow = []
    for k in range(100):
        sock = socket.create_connection(ref_server.server_address, timeout=10)
        # half the clients stop inside their headers, half inside their body
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: t\r\n" if k % 2 else _post_head(500) + b'{"inp')
        slow.append(sock)
    try:
        start = time.monotonic()
        status, data = request(ref_server, "POST", "/invocations", {"dataframe_records": RECORDS})
        assert status == 200 and time.monotonic() - start < 5
        _check_predictions(data, RECORDS)
        replies = []
        for sock in slow:
            received = b""
            while chunk := sock.recv(65536):  # until the server closes (timeout 10 s: a test failure)
                received += chunk
            replies.append(received)
    finally:
        for sock in slow:
            sock.close()
    assert all(r == b"" for r in replies[1::2])  # headers late: closed without a reply
    assert all(_status(r) == 408 and b"body not received within 1 s" in r for r in replies[::2])


def test_content_length_larger_than_the_body_gets_408_not_a_hang(ref_server):
    start = time.monotonic()
    reply = _raw(ref_server, _post_head(1000) + b'{"inputs": []}', wait=10)
    assert _status(reply) == 408 and time.monotonic() - start < 5


CONFLICTING_HEADERS = {
    "two content-lengths": _post_head(5, "Content-Length: 50\r\n") + b'{"a":1}',
    "content-length and chunked": _post_head(7, "Transfer-Encoding: chunked\r\n") + b"7\r\n{\"a\":1}\r\n0\r\n\r\n",
    "bad content-length": b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
    "unknown transfer-encoding": _post_head(7, "Transfer-Encoding: gzip, chunked\r\n") + b'{"a":1}',
}


@pytest.mark.parametrize("case", sorted(CONFLICTING_HEADERS))
def test_conflicting_length_headers_are_refused(ref_server, case):
    reply = _raw(ref_server, CONFLICTING_HEADERS[case])
    # h11 refuses (400, empty body) all but Content-Length + chunked, which it would read as chunked,
    # and a proxy in front might read by its length: refused before the body is read.
    expected = 411 if case == "content-length and chunked" else 400
    assert _status(reply) == expected and b"top-level" not in reply, reply
    assert reply.count(b"HTTP/1.1 ") == 1  # one answer, and the connection is closed after it
    assert request(ref_server, "GET", "/ping")[0] == 200


def test_a_body_is_never_read_as_a_second_request(ref_server):
    """Request smuggling: a GET whose body is a POST used to get two answers (the POST executed)."""
    inner = json.dumps({"dataframe_records": RECORDS}).encode()
    smuggled = _post_head(len(inner)) + inner
    head = f"GET /ping HTTP/1.1\r\nHost: t\r\nContent-Length: {len(smuggled)}\r\n\r\n".encode()
    reply = _raw(ref_server, head + smuggled, linger=1.5)
    assert reply.count(b"HTTP/1.1 ") == 1 and _status(reply) == 200 and b"predictions" not in reply


def test_oversized_body_gets_413_without_being_sent(ref_server):
    """Content-Length of 1 GB and no body at all: the 413 comes at once (nothing read or awaited)."""
    start = time.monotonic()
    reply = _raw(ref_server, _post_head(10**9))
    assert _status(reply) == 413 and b"body of 1000000000 bytes is over the limit of 20000 bytes" in reply
    assert b"connection: close" in reply.lower() and time.monotonic() - start < 2


def test_chunked_body_gets_411_without_being_read(ref_server):
    """A chunked body (no Content-Length) could be of any size: refused before a byte of it is read."""
    chunk = b"x" * 8192
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4))  # no final chunk
    head = b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    reply = _raw(ref_server, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
    assert _status(reply) == 411 and b"send the body with a Content-Length and no Transfer-Encoding" in reply
    assert b"connection: close" in reply.lower()


def test_uamt_serve_on_a_busy_port_is_a_clear_error(tmp_path, capsys):
    from uamt.cli import main

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        argv = ["serve", "--params", str(tmp_path / "none.yaml"), "--model", f"models:/{QE_MODEL}@champion"]
        assert main([*argv, "--port", str(port)]) == 2
    assert f"uamt serve: error: cannot listen on 127.0.0.1:{port}:" in capsys.readouterr().err


# ============================================================================ admission control
class SlowPredictor(FakePredictor):
    """The fake, taking ``work / chars_per_s`` seconds per call as the encoder would (uamt.serving.rest's work
    measure), and counting its calls and the most that ran at once."""

    def __init__(self, chars_per_s: float, uses_references: bool = True):
        super().__init__(uses_references)
        self.chars_per_s, self.calls, self.active, self.peak = chars_per_s, 0, 0, 0
        self._guard = threading.Lock()

    def predict_frame(self, frame, **kwargs):
        from uamt.serving.rest import frame_work

        with self._guard:
            self.calls += 1
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(sum(frame_work(frame)) / self.chars_per_s)
            return super().predict_frame(frame, **kwargs)
        finally:
            with self._guard:
                self.active -= 1


def _records(n: int, chars: int, refs: int = 1) -> list[dict]:
    """``n`` reference-based records whose src, mt and each reference have ``chars`` characters."""
    text = ("The quick brown fox jumps over the lazy dog. " * (chars // 45 + 1))[:chars]
    return [{"src": text, "mt": text, "refs": [text] * refs} for _ in range(n)]


def _timed_request(server, records, timeout: float = 30):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    start = time.monotonic()
    try:
        conn.request("POST", "/invocations", json.dumps({"dataframe_records": records}).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        body = response.read()
        return response.status, json.loads(body), response.getheader("Retry-After"), time.monotonic() - start
    finally:
        conn.close()


# name: (settings, background requests sent first, the probe request, expected status, needle, most seconds
# the probe may take).  The slow fake reads 10,000 characters per second.
ADMISSION_CASES = {
    "work over the budget": (
        {"max_work_chars": 1_000},
        [],
        _records(1, 334),  # 3 x 334 = 1,002 characters
        413,
        "request needs 1,002 characters of scoring work (src + mt + reference of every scoring pass), "
        "over the limit of 1,000 per request",
        1.0,
    ),
    "work at the budget": ({"max_work_chars": 1_002}, [], _records(1, 334), 200, "predictions", 1.0),
    "every reference is a scoring pass": (
        {"max_work_chars": 1_000},
        [],
        _records(1, 100, refs=4),  # 4 passes x 300 characters
        413,
        "request needs 1,200 characters",
        1.0,
    ),
    "queue full": (
        {"max_waiting": 1},
        [_records(2, 1500), _records(2, 1500)],  # 1.8 s each: one scored, one waiting
        _records(1, 10),
        503,
        "server busy: 1 requests are already waiting for the model (the limit)",
        0.5,
    ),
    "not at the model within the time limit": (
        {"request_timeout_s": 0.5},
        [_records(2, 1500)],
        _records(1, 10),
        503,
        "server busy: the model was not free within the limit of 0.5 s per request",
        1.0,
    ),
    "scoring past the time limit": (
        {"request_timeout_s": 0.5, "batch_size": 2},
        [],
        _records(8, 500),  # 4 chunks of 2 records, 0.3 s each: stopped after the second
        504,
        "scoring took longer than the limit of 0.5 s per request (waiting included); stopped after 4 of 8 "
        "records",
        1.0,
    ),
}


@pytest.mark.parametrize("case", sorted(ADMISSION_CASES))
def test_admission_control(case):
    overrides, background, probe, expected, needle, most_seconds = ADMISSION_CASES[case]
    settings = ServeSettings(**{"max_chars": 2000, "max_pairs": 1024, **overrides})
    predictor = SlowPredictor(chars_per_s=10_000)
    with running_server(ScoringService(predictor, "slow-fake", settings)) as server:
        with ThreadPoolExecutor(max_workers=len(background) + 1) as pool:
            started = []
            for records in background:
                started.append(pool.submit(_timed_request, server, records))
                time.sleep(0.15)  # in this order
            status, answer, retry_after, seconds = _timed_request(server, probe)
            background_statuses = [f.result()[0] for f in started]
        assert status == expected, answer
        assert needle in (answer["error"] if status != 200 else "predictions"), answer
        assert seconds < most_seconds, seconds
        if status == 503:
            assert retry_after is not None and int(retry_after) >= 1
        assert set(background_statuses) <= {200}
        assert predictor.peak <= 1
        # the server is free again and answers at once
        status, _, _, seconds = _timed_request(server, _records(1, 10))
        assert status == 200 and seconds < 1.0


def test_a_small_request_is_not_stalled_by_large_ones():
    """Two clients each sent 256 records x 4 references x 2,000 characters (3.3 MB, inside the other
    limits): they held the model 137 s and a 1-record request behind them waited 130.5 s.  Now such
    a request is over the work budget (413 at once), and two requests at the budget (5 s each at the
    assumed rate; 1.2 s at this fake's) delay a small one by at most their budgeted time."""
    from uamt.serving.rest import MAX_WORK_CHARS

    predictor = SlowPredictor(chars_per_s=50_000)
    with running_server(ScoringService(predictor, "slow-fake", ServeSettings())) as server:
        attack = _records(256, 2000, refs=4)
        at_budget = _records(MAX_WORK_CHARS // 3000, 1000)
        with ThreadPoolExecutor(max_workers=5) as pool:
            big = [pool.submit(_timed_request, server, attack, 20) for _ in range(2)]
            large = [pool.submit(_timed_request, server, at_budget, 20) for _ in range(2)]
            time.sleep(0.5)
            status, answer, _, seconds = _timed_request(server, _records(1, 40), timeout=20)
            big_results, large_results = [f.result() for f in big], [f.result() for f in large]
    assert [r[0] for r in big_results] == [413, 413]
    assert "over the limit of 60,000 per request" in big_results[0][1]["error"]
    assert max(r[3] for r in big_results) < 10  # refused without scoring (parsing 3.3 MB takes a moment)
    assert [r[0] for r in large_results] == [200, 200]
    assert status in (200, 503), answer
    assert seconds < 2 * MAX_WORK_CHARS / 50_000 + 2.0, seconds  # two budgets at most, then its own turn
    assert predictor.peak == 1 and predictor.calls <= 3 + 2  # the two large ones (a chunk each), the small one


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--max-work-chars", "0", "--max-work-chars must be >= 1, got 0"),
        ("--max-waiting", "-1", "--max-waiting must be >= 0, got -1"),
        ("--request-timeout", "0", "--request-timeout must be a number of seconds > 0, got 0.0"),
        ("--request-timeout", "nan", "--request-timeout must be a number of seconds > 0, got nan"),
    ],
)
def test_uamt_serve_refuses_bad_admission_settings(tmp_path, capsys, option, value, needle):
    from uamt.cli import main

    argv = ["serve", "--params", str(tmp_path / "none.yaml"), "--model", "/nonexistent", option, value]
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"request_timeout_s": float("nan")}, "request_timeout_s must be a number of seconds > 0, got nan"),
        ({"request_timeout_s": 0.0}, "request_timeout_s must be a number of seconds > 0, got 0.0"),
        ({"max_waiting": -1}, "max_waiting must be >= 0 and max_work_chars >= 1, got -1 and 60000"),
        ({"max_work_chars": 0}, "max_waiting must be >= 0 and max_work_chars >= 1, got 64 and 0"),
    ],
)
def test_admission_settings_are_checked_when_the_app_is_built(overrides, needle):
    from uamt.core.errors import UamtError
    from uamt.serving.server import make_app

    service = ScoringService(FakePredictor(), "fake", ServeSettings(**overrides))
    with pytest.raises(UamtError, match=re.escape(needle)):
        make_app(service)


# ============================================================================ round 3: exposure
@pytest.mark.parametrize(
    ("model_uri", "shown"),
    [
        ("/srv/secret/uamt/models/pyfunc", "pyfunc"),
        ("relative/dir/pyfunc/", "pyfunc"),
        ("file:///srv/secret/uamt/pyfunc", "pyfunc"),
        (f"models:/{REF_MODEL}@champion", f"models:/{REF_MODEL}@champion"),
        ("runs:/0123abcd/model", "runs:/0123abcd/model"),
    ],
)
def test_health_and_metadata_never_show_a_path_on_the_server(model_uri, shown):
    """Before: /health and /metadata returned `--model`'s absolute path. Now a local folder is named
    by its last component; registry and run URIs are shown as given."""
    with running_server(ScoringService(FakePredictor(), model_uri, SETTINGS)) as server:
        answers = {path: request(server, "GET", path) for path in ("/health", "/version", "/metadata")}
    for path, (status, data) in answers.items():
        assert status == 200, path
        assert json.loads(data)["model"] == shown, path
        assert b"/srv/secret" not in data and b"relative/dir" not in data, path


@pytest.mark.parametrize(
    ("host", "warning"),
    [
        ("127.0.0.1", None),
        ("127.0.0.2", None),
        ("::1", None),
        ("[::1]", None),
        ("localhost", None),
        ("0.0.0.0", "every network interface"),
        ("::", "every network interface"),
        ("192.0.2.10", "an interface other machines can reach"),
        ("fe80::1%eth0", "an interface other machines can reach"),
    ],
)
def test_a_host_other_machines_can_reach_is_warned_about(host, warning):
    """Before: `uamt serve --host 0.0.0.0` said nothing; it serves anyone who can reach the machine."""
    from uamt.serving.server import exposure_warning

    said = exposure_warning(host)
    if warning is None:
        assert said is None
    else:
        assert said.startswith(f"--host {host} listens on {warning}") and "no authentication" in said


def test_serving_on_every_interface_prints_the_warning(capsys):
    from uamt.serving.server import make_server

    _, sock = make_server(ScoringService(FakePredictor(), "fake", SETTINGS), "0.0.0.0", 0)
    sock.close()
    err = capsys.readouterr().err
    assert re.fullmatch(r"uamt serve: warning: --host 0\.0\.0\.0 listens on every network interface: .*\n", err), err
    _, sock = make_server(ScoringService(FakePredictor(), "fake", SETTINGS), "127.0.0.1", 0)
    sock.close()
    assert capsys.readouterr().err == ""
