"""The JSON contracts page and its JSON Schemas: pydantic's own for the config and bench records, and for the
dataclass contracts a schema inferred from their own ``to_json`` on a committed fixture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkserve.docgen.base import HEADER, REPO


def infer_schema(value: Any) -> dict[str, Any]:
    """A JSON Schema for one document: objects with their keys (all required), arrays of the merged schema
    of their items, scalar types. Deterministic (keys in document order)."""
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: infer_schema(v) for k, v in value.items()},
                "required": list(value)}
    if isinstance(value, list):
        if not value:
            return {"type": "array"}
        merged = infer_schema(value[0])
        for v in value[1:]:
            merged = _merge_schema(merged, infer_schema(v))
        return {"type": "array", "items": merged}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if value is None:
        return {"type": "null"}
    return {"type": "string"}


def _merge_schema(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if a == b:
        return a
    if a.get("type") == b.get("type") == "object":
        props = dict(a["properties"])
        for k, v in b["properties"].items():
            props[k] = _merge_schema(props[k], v) if k in props else v
        return {"type": "object", "properties": props,
                "required": [k for k in a["required"] if k in b["required"]]}
    if a.get("type") == b.get("type") == "array":
        if "items" in a and "items" in b:
            return {"type": "array", "items": _merge_schema(a["items"], b["items"])}
        return a if "items" in a else b
    types_ = sorted({*_types(a), *_types(b)})
    return {"type": types_} if all("properties" not in s and "items" not in s for s in (a, b)) else {
        "anyOf": [a, b]}


def _types(s: dict[str, Any]) -> list[str]:
    t = s.get("type")
    return t if isinstance(t, list) else [t] if t else []


def _envelope(doc: dict[str, Any]) -> dict[str, Any]:
    from sparkserve.commands.jsonschema import JSON_SCHEMA

    return {"schema": JSON_SCHEMA, **doc}


def _gates_doc() -> dict[str, Any]:
    from sparkserve.config import load_config
    from sparkserve.observe.saved import LogFile, judge_files

    fx = REPO / "tests" / "fixtures" / "logs"
    cfg = load_config(REPO / "sparkserve" / "data" / "default.yaml")
    report = judge_files(cfg, [LogFile(fx / "v0.33-head.log", "spark-a", "--from-log"),
                               LogFile(fx / "v0.33-follower.log", "spark-b", "--from-log")], skip=[])
    return _envelope(report.to_json())


def _analyze_doc() -> dict[str, Any]:
    from sparkserve.observe.saved import LogFile, analyze_files

    fx = REPO / "tests" / "fixtures" / "logs"
    return _envelope(analyze_files([LogFile(fx / "v0.33-head.log"), LogFile(fx / "fault-nccl-0.33-follower.log")]
                                   ).to_json())


def _doctor_doc() -> dict[str, Any]:
    from sparkserve.deploy.doctor import Check, as_json

    return _envelope(as_json([Check("spark-a", "ssh", "ok", "reachable as ubuntu@spark-a"),
                              Check("spark-a", "port 0.0.0.0:8000", "fail", "port 0.0.0.0:8000 is already in use")]))


def _status_doc() -> dict[str, Any]:
    from sparkserve.deploy.serving import Serving
    from sparkserve.deploy.stack import ApiStatus, ContainerStatus, StackStatus

    c = ContainerStatus("sparkserve-r0-spark-a", "0123456789ab", 0, "head", "running", "fedcba987654", "sha256:8e3")
    st = StackStatus({"spark-a": [c]}, ApiStatus("http://10.0.0.1:8000", True, ["glm"]), True, ["fedcba987654"],
                     gates=True)
    sv = Serving("2026-12-01T11:42:24Z", 60.0, "glm", "/models/t", "/models/d", "0a1b", "/models/d", False,
                 "img:tag", "sha256:8e3", "fedcba987654", "http://10.0.0.1:8000/v1")
    return _envelope({**st.to_json(), "serving": sv.to_json()})


def json_schemas() -> dict[str, dict[str, Any]]:
    """name → JSON Schema of each firm --json contract."""
    from sparkserve.config import Config
    from sparkserve.measure.records import BenchResult

    inferred: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "gates": ("`sparkserve gates --json` (and `gates --from-log`)", _gates_doc),
        "logs-analyze": ("`sparkserve logs analyze --json`", _analyze_doc),
        "doctor": ("`sparkserve doctor --json`", _doctor_doc),
        "status": ("`sparkserve status --json`", _status_doc),
    }
    out: dict[str, dict[str, Any]] = {
        "config": {**Config.model_json_schema(), "$schema": "https://json-schema.org/draft/2020-12/schema",
                   "title": "`sparkserve.yaml`"},
        "bench": {**BenchResult.model_json_schema(), "$schema": "https://json-schema.org/draft/2020-12/schema",
                  "title": "`sparkserve bench --json`"},
    }
    for name, (title, make) in inferred.items():
        out[name] = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title,
                     "description": "inferred from the contract's own to_json() on a committed fixture",
                     **infer_schema(make())}
    _name_the_gates(out["gates"])
    return out


def _name_the_gates(schema: dict[str, Any]) -> None:
    """`gates[].name`: one of the gates, by the names the CLI and the docs use (the card's five, then sparkserve's)."""
    from sparkserve.observe.gate_report import GATE_NAMES, gate_story

    name = schema["properties"]["gates"]["items"]["properties"]["name"]
    name.update({"enum": list(GATE_NAMES), "description": f"{gate_story()}, in this order"})


def json_page(schemas: dict[str, dict[str, Any]]) -> str:
    rows = [f"| {s['title']} | [{name}.schema.json](schemas/{name}.schema.json) |" for name, s in schemas.items()]
    return HEADER + "\n".join([
        "# JSON contracts\n",
        "Every read command takes `--json` and prints one document on stdout, `\"schema\": 1` first, even when "
        "it fails (then `\"ok\": false` and an `\"error\"` object with `where`, `what`, `exit_code` and "
        "`details`). The shapes are firm contracts: a change of shape bumps `schema`.\n",
        "| document | JSON Schema |", "|---|---|", *rows,
        "\nThe config and bench schemas are pydantic's own; the others are inferred from each contract's "
        "`to_json()` run on a committed fixture, so a key added to or removed from the code changes them.",
    ]) + "\n"

