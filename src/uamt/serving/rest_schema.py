"""The JSON bodies of ``uamt serve``'s ``POST /invocations`` as pydantic models, for its OpenAPI schema.

Derived from the served model's signature (:func:`uamt.serving.calibrated_predictor.signature_columns`):
a record's fields are the signature's inputs, a prediction's its outputs, each with the JSON type of
its MLflow type.  Beside them are what the REST contract (:mod:`uamt.serving.rest`) adds: ``refs``
(several references, averaged) on a reference-based model's records, the request's ``params``
(:data:`uamt.serving.rest.PARAM_FIELDS`), and per prediction the optional ``epistemic_var``,
``aleatoric_var``, ``clipped``, ``flag_risk``, ``flagged``, ``calibration`` and
``lp_seen_in_training``; beside the predictions, ``warnings``.

The models describe the contract; they do not parse requests.  :meth:`uamt.serving.rest.ScoringService.parse`
does, with messages that name the record and field (a 400, never FastAPI's 422), so the JSON in and
out is what it was before the models existed.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from uamt.serving.calibrated_predictor import signature_columns
from uamt.serving.rest import FORMAT_KEYS, PARAM_FIELDS

#: JSON types of the MLflow column types a uamt signature uses.
JSON_TYPES: dict[str, type] = {"string": str, "double": float, "long": int, "integer": int, "boolean": bool}

_STRICT = ConfigDict(extra="forbid")

#: What the REST server adds to each prediction, beside the signature's outputs.
PREDICTION_EXTRAS: dict[str, tuple[Any, str]] = {
    "epistemic_var": (float | None, "model (epistemic) part of sigma^2, where the method separates it"),
    "aleatoric_var": (float | None, "data (aleatoric) part of sigma^2, where the method separates it"),
    "clipped": (bool, "mu or the interval was clipped to the score scale's range"),
    "flag_risk": (float | None, "P(Q <= params.flag_below), when flag_below is not the server's risk threshold"),
    "flagged": (bool, "the risk at params.flag_below is above params.max_risk"),
    "calibration": (Literal["per-lp", "global"], "which calibration scored the record (when lp is given)"),
    "lp_seen_in_training": (bool, "false: the pair is outside the model's calibration, its interval widened"),
}


class RequestParams(BaseModel):
    """MLflow's ``params`` beside the data: flag records whose quality is probably below a threshold."""

    model_config = _STRICT

    flag_below: float | None = Field(None, description="quality threshold chi: adds flagged (and flag_risk)")
    max_risk: float | None = Field(None, description="flag when P(Q <= flag_below) is above this (default 0.5)")


class DataframeSplit(BaseModel):
    """pandas' ``split`` orientation: column names and rows of values."""

    model_config = _STRICT

    columns: list[str]
    data: list[list[Any]]


assert tuple(RequestParams.model_fields) == PARAM_FIELDS, "RequestParams must name rest.PARAM_FIELDS"


@functools.lru_cache(maxsize=4)
def rest_models(uses_references: bool) -> dict[str, type[BaseModel]]:
    """``{"record", "prediction", "request", "response"}``: the pydantic models of a model that
    ``uses_references`` (else a reference-free one), built from its signature."""
    # The signature's params (confidence, risk threshold) are the server's settings, not the request's.
    columns = signature_columns(not uses_references, default_risk_threshold=0.0)
    record_fields: dict[str, Any] = {}
    for name, kind, required in columns.inputs:
        json_type = JSON_TYPES[kind]
        # A reference-based record gives ref or refs: neither is required on its own.
        optional = not required or name == "ref"
        record_fields[name] = (json_type | None, None) if optional else (json_type, ...)
    if uses_references:
        record_fields["refs"] = (list[str] | None, Field(None, description="several references (averaged)"))
    record = create_model("Record", __config__=_STRICT, **record_fields)

    prediction_fields: dict[str, Any] = {
        name: (JSON_TYPES[kind] | None, Field(..., description="null where not finite"))
        for name, kind in columns.outputs
    }
    for name, (annotation, description) in PREDICTION_EXTRAS.items():
        prediction_fields[name] = (annotation | None, Field(None, description=description))
    prediction = create_model("Prediction", __config__=_STRICT, **prediction_fields)

    records_or_columns = list[record] | dict[str, list[Any]]
    request_fields: dict[str, Any] = {
        "dataframe_records": (list[record] | None, None),
        "dataframe_split": (DataframeSplit | None, None),
        "inputs": (records_or_columns | None, None),
        "instances": (records_or_columns | None, Field(None, description="alias of inputs")),
        "params": (RequestParams | None, None),
    }
    assert tuple(request_fields)[:-1] == FORMAT_KEYS, "the request model must name rest.FORMAT_KEYS"
    request = create_model(
        "InvocationRequest",
        __config__=_STRICT,
        __doc__="Exactly one of dataframe_records, dataframe_split, inputs or instances; optionally params.",
        **request_fields,
    )
    response = create_model(
        "InvocationResponse",
        __config__=_STRICT,
        predictions=(list[prediction], ...),
        warnings=(list[str] | None, Field(None, description="one message per language pair outside the model's calibration")),
    )
    return {"record": record, "prediction": prediction, "request": request, "response": response}


def add_invocations_schema(openapi: dict[str, Any], request: type[BaseModel]) -> dict[str, Any]:
    """``openapi`` (FastAPI's schema of the app) with ``request`` as the body of ``POST /invocations``
    (the route reads the raw body itself, so FastAPI cannot see its model)."""
    schema = request.model_json_schema(ref_template="#/components/schemas/{model}")
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    components.update(schema.pop("$defs", {}))
    components[request.__name__] = schema
    openapi["paths"]["/invocations"]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}},
    }
    return openapi
