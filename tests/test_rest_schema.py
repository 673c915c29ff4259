"""The REST bodies of ``uamt serve`` as pydantic models derived from the model's signature: the OpenAPI
schema names every field, and the JSON the server answers (unchanged by the models) fits them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pydantic
import pytest
from test_scoring_support import FakePredictor

from uamt.serving.calibrated_predictor import signature_columns
from uamt.serving.rest import ScoringService, ServeSettings
from uamt.serving.rest_schema import PREDICTION_EXTRAS, rest_models
from uamt.serving.server import make_app

DOCS = Path(__file__).resolve().parents[1] / "docs"


class FakeLpPredictor(FakePredictor):
    """The fake, declaring the language pairs it knows as a uamt pyfunc does."""

    language_pairs = {"de-en": "per-lp", "en-de": "global"}


def openapi_of(predictor) -> dict:
    return make_app(ScoringService(predictor, "fake", ServeSettings())).openapi()


@pytest.mark.parametrize(
    ("uses_references", "record_fields", "required"),
    [(True, {"src", "mt", "ref", "refs", "lp", "campaign"}, {"src", "mt"}), (False, {"src", "mt", "lp", "campaign"}, {"src", "mt"})],
    ids=["reference-based", "reference-free"],
)
def test_openapi_schema_names_the_request_and_response_fields(uses_references, record_fields, required):
    schema = openapi_of(FakePredictor(uses_references))
    components = schema["components"]["schemas"]
    operation = schema["paths"]["/invocations"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/InvocationRequest"}
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/InvocationResponse"}
    assert set(components["InvocationRequest"]["properties"]) == {
        "dataframe_records", "dataframe_split", "inputs", "instances", "params"
    }  # fmt: skip
    assert set(components["Record"]["properties"]) == record_fields
    assert set(components["Record"]["required"]) == required
    assert set(components["RequestParams"]["properties"]) == {"flag_below", "max_risk"}
    assert set(components["InvocationResponse"]["properties"]) == {"predictions", "warnings"}
    outputs = {name for name, _ in signature_columns(not uses_references, 0.0).outputs}
    assert outputs == {"mu", "sigma", "lower", "upper", "risk"}
    assert set(components["Prediction"]["properties"]) == outputs | set(PREDICTION_EXTRAS)
    assert set(components["Prediction"]["required"]) == outputs
    refs = json.dumps(schema)
    assert all(f"#/components/schemas/{name}" in refs or name == "InvocationRequest" for name in components)
    assert not re.search(r'"\$ref": "#/\$defs/', refs)  # every reference resolves in the document


def test_the_record_fields_follow_the_signature_inputs():
    """The record model is built from the signature: a new input column shows up without other edits."""
    for uses_references in (True, False):
        inputs = {name for name, _, _ in signature_columns(not uses_references, 0.0).inputs}
        assert inputs <= set(rest_models(uses_references)["record"].model_fields)


ANSWERED = [
    ("records", {"dataframe_records": [{"src": "Hallo Welt.", "mt": "Hello world.", "ref": "Hello, world."}]}),
    ("refs-and-lp", {"dataframe_records": [{"src": "a b", "mt": "a b", "refs": ["a b", "b a"], "lp": "de-en"},
                                           {"src": "c", "mt": "c d", "ref": "c", "lp": "xx-yy"}]}),
    ("split", {"dataframe_split": {"columns": ["src", "mt", "ref"], "data": [["x y", "x", "x y z"]]}}),
    ("columns-and-flag", {"inputs": {"src": ["a"], "mt": ["a b c"], "ref": ["a b"]},
                          "params": {"flag_below": 0.5, "max_risk": 0.2}}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "payload"), ANSWERED, ids=[a[0] for a in ANSWERED])
def test_what_the_server_answers_fits_the_response_model(name, payload):
    models = rest_models(True)
    service = ScoringService(FakeLpPredictor(), "fake", ServeSettings())
    models["request"].model_validate(payload)
    answer = service.invocations(json.dumps(payload).encode())
    checked = models["response"].model_validate(answer)
    assert checked.model_dump(exclude_unset=True) == answer  # the model names every field the server sends


def test_a_field_the_models_do_not_name_is_refused_by_them():
    models = rest_models(True)
    with pytest.raises(pydantic.ValidationError, match="surprise"):
        models["response"].model_validate({"predictions": [{"mu": 1, "sigma": 1, "lower": 0, "upper": 2,
                                                            "risk": 0.1, "surprise": 1}]})  # fmt: skip
    with pytest.raises(pydantic.ValidationError, match="ref"):
        rest_models(False)["request"].model_validate({"dataframe_records": [{"src": "a", "mt": "b", "ref": "c"}]})


def test_the_documented_request_fits_the_request_model():
    docs = (DOCS / "scoring.md").read_text(encoding="utf-8")
    body = re.search(r"curl .*?-d '(\{.*?\})'", docs, re.S).group(1)
    rest_models(True)["request"].model_validate(json.loads(body))
