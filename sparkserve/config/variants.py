"""A variant of the config: ``NAME=KEY=VALUE[,KEY=VALUE…]`` (``ab run --variant``, ``tune``) parsed, and the
full config it makes — the config with those dotted fields set, validated again as a whole.

    name, settings = parse_variant("k5=speculative.num_speculative_tokens=5")
    cfg5 = variant_config(cfg, settings)          # BadInput naming the field; cfg itself is not changed
    variant_config(cfg, {"profile": "long-800k"})  # the profile's values, where cfg took them from its profile

Values are YAML scalars or flow collections (``5``, ``0.9``, ``null``, ``[1,2,4,8]``, ``FULL``). ``drafter`` is
the one key that is not a config field: a local drafter directory, booted through the swap path (the campaign
hashes and syncs it; :data:`DRAFTER_KEY`), so it is left out of the config made here.

Changing ``profile`` re-applies the profile to every profile field the config did not set itself (those it
set stay: :func:`sparkserve.config.profiles.overrides` lists them), as if the file named the other profile.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from pydantic import ValidationError

from sparkserve.config import profiles
from sparkserve.config.root import Config
from sparkserve.errors import BadInput

DRAFTER_KEY = "drafter"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_.]*\s*=)")  # a comma that starts the next KEY=


def parse_value(text: str) -> Any:
    """A setting's value as YAML reads it (``5`` → 5, ``[1,2]`` → [1, 2], ``null`` → None)."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def parse_settings(text: str, where: str) -> dict[str, Any]:
    """``KEY=VALUE[,KEY=VALUE…]`` → {dotted key: value}; a comma inside ``[…]`` belongs to the value."""
    out: dict[str, Any] = {}
    for part in _SPLIT.split(text):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise BadInput(where, f"{part!r}: expected KEY=VALUE with KEY a config field, e.g. "
                           "speculative.num_speculative_tokens=5")
        if key in out:
            raise BadInput(where, f"{key} is set twice")
        out[key] = value.strip() if key == DRAFTER_KEY else parse_value(value.strip())
    return out


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=KEY=VALUE[,KEY=VALUE…]`` → (name, settings); BadInput naming ``--variant``."""
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise BadInput("--variant", f"{text!r}: expected NAME=KEY=VALUE[,KEY=VALUE…], e.g. "
                       "k5=speculative.num_speculative_tokens=5")
    if not _NAME.match(name):
        raise BadInput("--variant", f"{name!r}: a variant name is letters, digits, - or _ (e.g. k5=…)")
    return name, parse_settings(rest, f"--variant {name}")


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise KeyError(dotted)
        node = nxt
    node[leaf] = value


def _drop(data: dict[str, Any], dotted: str) -> None:
    section, key = dotted.split(".")
    if isinstance(data.get(section), dict):
        data[section].pop(key, None)


def variant_config(cfg: Config, settings: dict[str, Any], *, where: str = "--variant") -> Config:
    """``cfg`` with ``settings`` set (the ``drafter`` key left to the campaign), validated as a whole config;
    BadInput ``<where>: <field>: <what>`` for a field that does not exist or a value the config refuses."""
    data = json.loads(cfg.model_dump_json())
    fields = {k: v for k, v in settings.items() if k != DRAFTER_KEY}
    if "profile" in fields:
        own = {f for f, _, _ in profiles.overrides(cfg)}  # fields the config sets itself: they stay
        for f in profiles.FIELDS:
            if f not in own and f not in fields:
                _drop(data, f)
        try:
            prof = profiles.get(None if fields["profile"] is None else str(fields["profile"]))
        except ValueError as e:
            raise BadInput(where, str(e).removeprefix("@")) from None
        if prof.uses_drafter and data.get("drafter") is None:
            raise BadInput(where, f"profile: {fields['profile']} drafts with a drafter: the config has none "
                           "(add drafter=PATH to the variant)")
    for key, value in fields.items():
        try:
            _set(data, key, value)
        except KeyError:
            raise BadInput(where, f"{key}: not a config field (its parent is not a section)") from None
    try:
        return Config(**data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if msg.startswith("@") and ": " in msg:
            loc, msg = msg[1:].split(": ", 1)
        if err["type"] == "extra_forbidden":
            msg = "not a config field (`sparkserve validate` lists none such; see docs/reference/config.md)"
        raise BadInput(where, f"{loc}: {msg}") from None
    except ValueError as e:  # a profile name the card does not have
        raise BadInput(where, str(e).removeprefix("@")) from None


def settings_text(settings: dict[str, Any]) -> str:
    """The settings as the command line writes them (``speculative.num_speculative_tokens=5``)."""
    def one(v: Any) -> str:
        if isinstance(v, str):
            return v
        return json.dumps(v, separators=(",", ":"))
    return ",".join(f"{k}={one(v)}" for k, v in settings.items())
