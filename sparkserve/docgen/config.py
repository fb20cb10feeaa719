"""The configuration reference page, from the pydantic model: one heading per section, every field under its
own anchor (``#serve.port``) with its type, default, environment variable and description (the pydantic
``Field`` descriptions in :mod:`sparkserve.config`), what `sparkserve init`'s file sets where it differs from the
default, and the model card's launcher value where the card runs another."""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any

from sparkserve.docgen.base import HEADER


def _is_model(t: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(t, type) and issubclass(t, BaseModel)


def _unwrap(ann: Any) -> tuple[Any, bool]:
    """(the annotation without Optional/Annotated, whether it takes null)."""
    nullable = False
    for _ in range(5):
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            nullable = nullable or len(args) < len(typing.get_args(ann))
            if len(args) == 1:
                ann = args[0]
            else:
                break
        else:
            break
    return ann, nullable


def _type_name(field: Any) -> str:
    raw = field.annotation
    meta = " ".join(str(m) for m in field.metadata)
    ann, nullable = _unwrap(raw)
    if "_size" in repr(field.metadata) or "ByteSize" in repr(raw) or "_size" in meta:
        name = "size (bytes, or `8GiB`)"
    else:
        name = _ann_name(ann)
    return name + (" or null" if nullable else "")


def _ann_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_ann_name(_unwrap(a)[0]) for a in typing.get_args(ann) if a is not type(None))
    if origin is list:
        return f"list of {_ann_name(_unwrap(typing.get_args(ann)[0])[0])}"
    if origin is dict:
        k, v = typing.get_args(ann)
        return f"map {_ann_name(k)} → {_ann_name(v)}"
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in ann)
    if ann is Path:
        return "path"
    return getattr(ann, "__name__", str(ann))


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if _is_model(type(value)):
        return "(section)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value, default=str)}`"


#: What a section is for (its class docstring's first paragraph when it has one and this has none).
SECTION_INTRO: dict[str, str] = {
    "": "Fields at the top of the file.",
    "nodes": "The Sparks, in order: the first is the head (the API server, node-rank 0), the others followers. "
             "With one node there is no rendezvous; TP = nodes × `gpus`. Each node is reached over SSH the way "
             "`ssh` reaches it ([a laptop as the control machine](../getting-started/laptop.md)), or is this machine "
             "(`local: true`).",
    "ssh": "How the nodes are reached. Host keys are always verified; `~/.ssh/config` is read as OpenSSH reads it.",
    "fabric": "The ConnectX-7 link NCCL runs on ([the fabric](../concepts/fabric.md)); `auto` values are read "
              "from each node's sysfs at `up`.",
    "image": "The image every rank runs ([build, ship and verify the image](../how-to/image.md)).",
    "model": "The target model ([install: the weights](../getting-started/install.md#the-weights)).",
    "drafter": "The DFlash2 drafter, bind-mounted read-only; swapped with `sparkserve swap-drafter`.",
    "serve": "The `vllm serve` flags (names follow `vllm serve`; `sparkserve render` shows the argv).",
    "serve.compilation": "`--compilation-config`: CUDA graphs.",
    "speculative": "`--speculative-config`.",
    "gates": "What the gates expect ([the gates](../concepts/gates.md)).",
    "gates.smoke": "The smoke cell the `smoke` gate runs against the API after boot.",
}

#: Where the model card's launcher (canada-quant/vllm-glm53-flash-sm121 scripts/launch_glm53_w4a16_dflash2_sm121.sh
#: @1c142c9; shared/docs/card-stack.md) runs another value than sparkserve's default, and why sparkserve differs.
CARD_VALUES: dict[str, tuple[str, str]] = {
    "nodes[].fabric_ip": ("192.168.102.1 / 192.168.102.2", "yours: the addresses of your CX-7 ports"),
    "fabric.interface": ("enp1s0f1np1", "detected per node ([where it differs](../concepts/card-differences.md))"),
    "fabric.hca": ("rocep1s0f1", "detected per node"),
    "fabric.gid_index": ("3", "read per node: the index differs between nodes and drifts after link events"),
    "fabric.addr_range": ("192.168.102.0/24", "the fabric IPs' own subnet"),
    "fabric.nccl_debug": ("WARN", "INFO shows which transport NCCL chose, which the `faults` gate reads"),
    "model.target": ("/models/glm53-w4a16", "the card's mount point; sparkserve mounts your path at /models/target"),
    "container.cache_root": ("/var/tmp/glm53-vllm-cache", "one cache directory per image ID, in the node "
                             "user's home"),
    "container.shm_size": ("32g", "ignored by docker under --ipc=host, which the card also passes"),
}


def _fields(model: Any, prefix: list[str], sections: dict[str, list[tuple[str, Any]]], section: str) -> None:
    """Every leaf field of ``model``, by section (``serve.compilation``…; ``""``: the top level)."""
    for name, field in model.model_fields.items():
        path = [*prefix, name]
        ann, _ = _unwrap(field.annotation)
        inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        if _is_model(ann):
            sections.setdefault(".".join(path), [])
            _fields(ann, path, sections, ".".join(path))
        elif inner is not None and _is_model(_unwrap(inner)[0]):
            sections.setdefault(".".join(path), []).append((".".join(path), field))
            _fields(_unwrap(inner)[0], [*path[:-1], name + "[]"], sections, ".".join(path))
        else:
            sections.setdefault(section, []).append((".".join(path), field))


def _init_values() -> dict[str, Any]:
    """dotted → the value `sparkserve init`'s file (the embedded default) sets; list items as ``nodes[].x`` (the
    first item's)."""
    from sparkserve.config import load_config

    out: dict[str, Any] = {}

    def walk(data: Any, prefix: str) -> None:
        if isinstance(data, dict):
            for k, v in data.items():
                walk(v, f"{prefix}{k}.")
        elif isinstance(data, list) and data and isinstance(data[0], dict):
            walk(data[0], prefix[:-1] + "[].")
        else:
            out[prefix[:-1]] = data

    walk(json.loads(load_config().model_dump_json()), "")
    return out


def _section_intro(name: str, model_doc: str | None) -> str:
    text = SECTION_INTRO.get(name) or (inspect.cleandoc(model_doc).split("\n\n")[0] if model_doc else "")
    return " ".join(text.split())


def _anchor(dotted: str) -> str:
    return dotted.replace("[]", "")


def _field_block(dotted: str, field: Any, init: dict[str, Any]) -> list[str]:
    from pydantic_core import PydanticUndefined

    ann, _ = _unwrap(field.annotation)
    is_list = typing.get_origin(ann) is list and _is_model(_unwrap(typing.get_args(ann)[0])[0])
    env = "SPARKSERVE_" + dotted.replace("[]", "").replace(".", "__").upper()
    env_s = "in the list (`SPARKSERVE_NODES`, JSON, sets them all)" if "[]" in dotted else (
        f"`{env}`" + (" (JSON)" if is_list else ""))
    kind = "list of sections (below)" if is_list else _type_name(field)
    facts = [kind, f"default {_default(field)}", f"environment {env_s}"]
    out = [f"### `{dotted}` {{ #{_anchor(dotted)} }}\n", " · ".join(facts) + "\n"]
    desc = " ".join((field.description or "").split())
    if desc:
        out.append(desc[0].upper() + desc[1:] + ("" if desc.endswith(".") else ".") + (
            " Not part of the deployment fingerprint." if field.exclude else "") + "\n")
    required = field.default is PydanticUndefined and field.default_factory is None
    if dotted in init and not is_list:
        value = init[dotted]
        default = None if required else field.default_factory() if field.default_factory else field.default
        if isinstance(default, enum.Enum):
            default = default.value
        if isinstance(default, Path):
            default = str(default)
        if required or json.dumps(value, default=str) != json.dumps(default, default=str):
            out.append(f"`sparkserve init` writes `{json.dumps(value)}`.\n")
    if dotted in CARD_VALUES:
        value, why = CARD_VALUES[dotted]
        out.append(f"The card's launcher: `{value}` — {why}.\n")
    return out


def config_page() -> str:
    from sparkserve.config import Config

    sections: dict[str, list[tuple[str, Any]]] = {"": []}
    _fields(Config, [], sections, "")
    init = _init_values()
    docs = _section_models(Config, [])
    body: list[str] = []
    count = 0
    for name, fields in sections.items():
        if not fields:
            continue
        body.append(f"## {name or 'Top level'} {{ #section-{name.replace('.', '-') or 'top'} }}\n")
        intro = _section_intro(name, docs.get(name))
        if intro:
            body.append(intro + "\n")
        for dotted, field in fields:
            body += _field_block(dotted, field, init)
            count += dotted != "nodes"
    return HEADER + "\n".join([
        "# Configuration reference\n",
        "`sparkserve.yaml` (or `-c FILE`, or `$SPARKSERVE_CONFIG`); `sparkserve init` writes the commented "
        "default — the model card's production state. Every field can be overridden from the environment, "
        "nested with `__` (`SPARKSERVE_SERVE__PORT=8001`); the environment wins over the file. Unknown keys are "
        "refused (with a \"did you mean\"). An error names its field (`error: serve.port: …`): each field has its "
        "anchor here (`config.md#serve.port`; list items without the `[]`). The machine-readable form is "
        "[config.schema.json](schemas/config.schema.json).\n",
        f"{count} fields in {sum(1 for f in sections.values() if f)} sections. Each says its type, its default "
        "(what applies when the key is absent), its environment variable; what `sparkserve init` writes where "
        "that differs from the default; and the card's launcher value where the card runs another (why: "
        "[where sparkserve differs from the card](../concepts/card-differences.md)).\n",
        *body,
    ]).rstrip() + "\n"


def _section_models(model: Any, prefix: list[str]) -> dict[str, str | None]:
    """section name → its model's docstring."""
    out: dict[str, str | None] = {}
    for name, field in model.model_fields.items():
        ann, _ = _unwrap(field.annotation)
        inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        sub = ann if _is_model(ann) else _unwrap(inner)[0] if inner is not None and _is_model(_unwrap(inner)[0]) \
            else None
        if sub is not None:
            dotted = ".".join([*prefix, name])
            out[dotted] = sub.__doc__ if sub.__doc__ and "Usage docs:" not in sub.__doc__ else None
            out.update(_section_models(sub, [*prefix, name]))
    return out
