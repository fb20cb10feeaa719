"""The target's chat template, rendered client-side as the model card's bench renders its prompts. No network.

Example::

    tpl = load_chat_template(Path("/models/glm53-w4a16"))    # BadInput naming the file when unusable
    text = tpl.render_user(prompt)                             # one user turn, generation prompt, thinking on
    tpl.source, tpl.sha256                                     # what the bench record names

The card's holdout client renders every prompt with the target tokenizer's ``apply_chat_template(
[{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True)``.
This module does the same with jinja2 alone (no transformers, no tokenizer), following how Hugging Face
tokenizers render a template:

* the template is ``chat_template.jinja`` in the tokenizer directory when that file exists (newer
  ``save_pretrained`` writes it there), else ``tokenizer_config.json``'s ``chat_template`` — a string, or a
  list of ``{"name", "template"}`` of which ``default`` is the one used without tools;
* a sandboxed, immutable jinja2 environment with ``trim_blocks`` and ``lstrip_blocks`` and the
  ``loopcontrols`` extension (``{% break %}`` / ``{% continue %}``);
* globals ``raise_exception(msg)`` (the render fails with that message) and ``strftime_now(fmt)``; the
  ``tojson`` filter is ``json.dumps`` with ``ensure_ascii=False`` (``indent``, ``separators``,
  ``sort_keys`` honoured);
* variables: ``messages``, ``add_generation_prompt``, ``tools`` / ``documents`` (None), the special tokens
  (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``, … from ``tokenizer_config.json``, then
  ``special_tokens_map.json``; an ``AddedToken`` object's ``content``), and the template kwargs
  (``enable_thinking``).

A template that needs more than this (a custom filter or extension) fails the render with its jinja2
error, named with the file: sparkserve never falls back to another rendering.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from sparkserve.errors import BadInput
from sparkserve.models.files import BadFile, MissingFile, parse_json, read_regular

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
_LIMIT = 64 << 20  # a tokenizer_config.json with an embedded vocabulary can be large; a template is not
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TemplateError(Exception):
    """The template raised (``raise_exception``) or jinja2 could not render it."""


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _token(v: Any) -> str | None:
    """A special token as the template sees it: the string itself, or an AddedToken object's content."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it is rendered with; ``source`` is the file it came from."""

    source: str
    template: str
    special_tokens: dict[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()

    @cached_property
    def _compiled(self) -> Any:
        from jinja2 import TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            return env.from_string(self.template)
        except TemplateSyntaxError as e:
            raise BadInput(self.source, f"chat template does not compile: {e.message} (line {e.lineno})") from None

    def compile(self) -> None:
        """Compile now: BadInput naming the file when the template is not valid jinja2."""
        _ = self._compiled

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """The prompt text for ``messages``; TemplateError when the template raises or cannot render."""
        from jinja2 import TemplateError as JinjaError

        values: dict[str, Any] = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
        try:
            return str(self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                             **values))
        except TemplateError:
            raise
        except JinjaError as e:
            raise TemplateError(f"{type(e).__name__}: {e}") from None

    def render_user(self, prompt: str, *, enable_thinking: bool = True) -> str:
        """The card's rendering of one holdout prompt: one user turn, the generation prompt, thinking on."""
        return self.render([{"role": "user", "content": prompt}], add_generation_prompt=True,
                           enable_thinking=enable_thinking)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = parse_json(read_regular(path, limit=_LIMIT))
    except MissingFile:
        return None
    except BadFile as e:
        raise BadInput(str(path), str(e)) from None
    if not isinstance(data, dict):
        raise BadInput(str(path), "must be a JSON object")
    return data


def _pick(value: Any, where: Path) -> str:
    """``chat_template`` as tokenizer_config.json holds it: a string, or named templates (``default``)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list):
        named = {d.get("name"): d.get("template") for d in value if isinstance(d, dict)}
        t = named.get("default")
        if isinstance(t, str) and t.strip():
            return t
        raise BadInput(str(where), f"chat_template lists {sorted(str(n) for n in named)} but no \"default\"")
    raise BadInput(str(where), "chat_template must be a non-empty string or a list of {name, template}")


def load_chat_template(path: Path, *, where: str = "--chat-template") -> ChatTemplate:
    """The chat template of a tokenizer directory (or of its ``tokenizer_config.json``, or a ``.jinja`` file);
    BadInput naming the option or the file when there is none or it does not compile."""
    path = path.expanduser()
    if not path.exists():
        raise BadInput(where, f"{path} does not exist")
    directory = path if path.is_dir() else path.parent
    cfg_file = directory / TOKENIZER_CONFIG
    tcfg = _read_json(cfg_file) if (path.is_dir() or path.name == TOKENIZER_CONFIG) else None
    jinja = directory / TEMPLATE_FILE if path.is_dir() else (path if path.name != TOKENIZER_CONFIG else None)
    template: str | None = None
    source = ""
    if jinja is not None:
        try:
            template = read_regular(jinja, limit=_LIMIT).decode("utf-8")
            source = str(jinja)
        except MissingFile:
            template = None
        except BadFile as e:
            raise BadInput(str(jinja), str(e)) from None
        except UnicodeDecodeError:
            raise BadInput(str(jinja), "is not UTF-8 text") from None
    if template is None and tcfg is not None and tcfg.get("chat_template") is not None:
        template, source = _pick(tcfg["chat_template"], cfg_file), str(cfg_file)
    if template is None:
        raise BadInput(where, f"{path}: no chat template ({TEMPLATE_FILE}, or chat_template in {TOKENIZER_CONFIG})")
    special: dict[str, Any] = {}
    smap = _read_json(directory / SPECIAL_TOKENS_MAP) if path.is_dir() or tcfg is not None else None
    for src in (tcfg or {}, smap or {}):
        for k in _SPECIAL:
            if k not in special and (v := _token(src.get(k))) is not None:
                special[k] = v
        extra = src.get("additional_special_tokens")
        if "additional_special_tokens" not in special and isinstance(extra, list):
            special["additional_special_tokens"] = [t for t in (_token(x) for x in extra) if t is not None]
    tpl = ChatTemplate(source=source, template=template, special_tokens=special)
    tpl.compile()
    return tpl
