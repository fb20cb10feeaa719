"""Loading the config: the file (``-c``, ``$SPARKSERVE_CONFIG``, ./sparkserve.yaml, or the embedded default)
with env overrides, and every validation problem turned into ``error: <field>: <what>`` with its YAML line
and, for an unknown key, "did you mean"."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ValidationError

from sparkserve.config.root import DEFAULT_CONFIG_NAME, ENV_PREFIX, Config
from sparkserve.errors import BadInput


def default_yaml_text() -> str:
    return resources.files("sparkserve").joinpath("data/default.yaml").read_text()


def _yaml_lines(text: str) -> Any:
    """The YAML's node tree (for line numbers), or None when it cannot be composed."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def _line_of(root: Any, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of ``loc`` (a pydantic error location) in the YAML node tree: the deepest key found."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if hit is None:
                return line
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the config section at ``loc`` (for "did you mean")."""
    import types
    import typing

    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann: Any = field.annotation
        for _ in range(4):  # unwrap Optional / list / Annotated down to a model
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                break
            if typing.get_origin(ann) in (list, typing.Union, types.UnionType, Annotated) and args:
                ann = args[0]
            else:
                break
        model = ann
    return list(getattr(model, "model_fields", {}))


def _one_error(err: Any, root: Any, source: str) -> tuple[str, str]:
    """One pydantic error as (field, what), with its YAML line and, for an unknown key, "did you mean"."""
    import difflib

    loc_t = tuple(err["loc"])
    loc = ".".join(str(p) for p in loc_t) or source
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if msg.startswith("@") and ": " in msg:  # a model-level rule naming its own field: "@nodes.1.name: ..."
        field, msg = msg[1:].split(": ", 1)
        loc = f"{loc}.{field}" if err["loc"] else field
        loc_t = loc_t + tuple(int(p) if p.isdigit() else p for p in field.split("."))
    if err["type"] == "extra_forbidden":
        near = difflib.get_close_matches(str(loc_t[-1]), _fields_at(loc_t[:-1]), n=1, cutoff=0.6)
        msg = "unknown field" + (f"; did you mean `{near[0]}`?" if near else
                                 " (check the spelling; names follow `vllm serve`)")
    elif err["type"] == "missing":
        msg = "is required"
    line = _line_of(root, loc_t) if root is not None else None
    if line is None and err["type"] == "missing" and root is not None:
        line = _line_of(root, loc_t[:-1])  # the section it is missing from
    where = f" ({source} line {line})" if line else ""
    return loc, msg + where


def _format_error(e: ValidationError, source: str, text: str | None = None) -> BadInput:
    """Every problem of a config, the unknown keys first (a misspelt key also makes its real name
    "required"): the first as the error's headline, each further one a detail line ``<field>: <what>``."""
    root = _yaml_lines(text) if text is not None else None
    errs = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
    found = [_one_error(err, root, source) for err in errs]
    (loc, msg), rest = found[0], found[1:]
    more = len(rest)
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return BadInput(loc, msg + tail, details=[f"{w}: {m}" for w, m in rest])


def find_config_path(path: Path | None) -> Path | None:
    if path is not None:
        return path
    env = os.environ.get(f"{ENV_PREFIX}CONFIG")
    if env:
        return Path(env)
    cwd = Path(DEFAULT_CONFIG_NAME)
    return cwd if cwd.exists() else None


def no_config_error() -> BadInput:
    """Exit 2 for a command that needs a config file and finds none."""
    return BadInput("config", f"no {DEFAULT_CONFIG_NAME} in {Path.cwd()} (or -c / {ENV_PREFIX}CONFIG); "
                    "run `sparkserve init`")


def load_config(path: Path | None = None, *, overrides: dict[str, Any] | None = None,
                require_file: bool = False) -> Config:
    """Load ``path`` (or ./sparkserve.yaml, or the embedded default) with env overrides applied.

    ``require_file``: no file found is an error (a command that reaches nodes never runs on the embedded
    default's placeholder hosts). Raises BadInput naming the field or file on any problem.
    """
    path = find_config_path(path)
    if path is None and require_file:
        raise no_config_error()
    source = str(path) if path else "embedded default"
    if path is not None and not path.exists():
        raise BadInput(str(path), "does not exist" + _near_file(path))
    try:
        text = path.read_text() if path else default_yaml_text()
    except OSError as e:
        raise BadInput(str(path), f"cannot read config: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise BadInput(where, f"not valid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        raise BadInput(source, "the config file is empty (run `sparkserve init` for a commented one)")
    if not isinstance(data, dict):
        raise BadInput(source, "the config must be a YAML mapping")
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return Config(**data)
    except ValidationError as e:
        raise _format_error(e, source, text) from None


def _near_file(path: Path) -> str:
    """"; did you mean X?" for a file next to ``path`` whose name is close to it."""
    import difflib

    try:
        names = [p.name for p in (path.parent if str(path.parent) else Path(".")).iterdir()]
    except OSError:
        return ""
    near = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {path.parent / near[0]}?" if near else ""


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
