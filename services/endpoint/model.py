"""botocore's service model for AWS Batch, the authority for the endpoint: which operation a
request is (`http.method` + `requestUri`), whether its input is valid (botocore's own
`ParamValidator`: required members, types, bounds, enums) and what an answer may contain
(`conform` keeps exactly the output shape's members, typed as the model says)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any


@cache
def service_model():
    import botocore.session

    return botocore.session.get_session().get_service_model("batch")


@cache
def routes() -> dict[tuple[str, str], str]:
    """(method, path) -> operation name, for every operation of the model."""
    model = service_model()
    found = {}
    for name in model.operation_names:
        http = model.operation_model(name).http
        found[(http["method"], http["requestUri"].split("?", 1)[0].rstrip("/"))] = name
    return found


def validation_errors(operation: str, params: dict[str, Any]) -> str | None:
    """botocore's report of what is wrong with `params` for `operation`, or None."""
    from botocore.validate import ParamValidator

    shape = service_model().operation_model(operation).input_shape
    if shape is None:
        return None
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        return report.generate_report()
    problems = list(_beyond_botocore(shape, params, "input"))
    return "\n".join(problems) if problems else None


def _beyond_botocore(shape, value, path: str):
    """What botocore's validator leaves to the service: enum values and `max` bounds."""
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                yield from _beyond_botocore(member, value[name], name if path == "input" else f"{path}.{name}")
    elif kind == "list" and isinstance(value, list):
        if "max" in shape.metadata and len(value) > shape.metadata["max"]:
            yield f"Invalid length for parameter {path}, length: {len(value)}, valid max length: {shape.metadata['max']}"
        for index, item in enumerate(value):
            yield from _beyond_botocore(shape.member, item, f"{path}[{index}]")
    elif kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            yield from _beyond_botocore(shape.value, item, f"{path}.{key}")
    elif kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            yield (f"Invalid value for parameter {path}, value: {value}, valid values: "
                   f"{', '.join(shape.enum)}")  # fmt: skip
        if "max" in shape.metadata and len(value) > shape.metadata["max"]:
            yield f"Invalid length for parameter {path}, length: {len(value)}, valid max length: {shape.metadata['max']}"
    elif kind in ("integer", "long") and isinstance(value, int) and "max" in shape.metadata:
        if value > shape.metadata["max"]:
            yield f"Invalid value for parameter {path}, value: {value}, valid max value: {shape.metadata['max']}"


def conform(operation: str, answer: dict[str, Any]) -> dict[str, Any]:
    shape = service_model().operation_model(operation).output_shape
    return {} if shape is None else _conform(shape, answer) or {}


def _conform(shape, value: Any) -> Any:
    if value is None:
        return None
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return None
        out = {}
        for name, member in shape.members.items():
            kept = _conform(member, value.get(name))
            if kept is not None:
                out[name] = kept
        return out
    if kind == "list":
        items = [_conform(shape.member, item) for item in value] if isinstance(value, list) else []
        return [item for item in items if item is not None]
    if kind == "map":
        return {str(k): v for k, v in ((k, _conform(shape.value, v)) for k, v in value.items())
                if v is not None} if isinstance(value, dict) else None  # fmt: skip
    if kind in ("integer", "long"):
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if kind in ("double", "float"):
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if kind == "boolean":
        return bool(value)
    if kind == "string":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return value
