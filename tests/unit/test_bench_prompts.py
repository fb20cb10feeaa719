"""Bench prompt files: JSONL with {"prompt"} or {"messages"} per line; a bad line names file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.measure.prompts import BUILTIN_NAME, builtin_prompts, load_prompts


def test_builtin_set_has_at_least_20_distinct_prompts() -> None:
    ps = builtin_prompts()
    texts = {p.messages[0]["content"] for p in ps.prompts}
    assert len(ps) >= 20 and len(texts) == len(ps)
    assert ps.source == BUILTIN_NAME and len(ps.sha256) == 64
    assert all(p.messages[0]["role"] == "user" for p in ps.prompts)


def test_prompt_and_messages_forms(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    f.write_text(json.dumps({"prompt": "hello"}) + "\n\n" + json.dumps({"messages": msgs}) + "\n")
    ps = load_prompts(f)
    assert [p.messages for p in ps.prompts] == [[{"role": "user", "content": "hello"}], msgs]
    assert ps.source == str(f)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "ok"', "not valid JSON"),
        ('["a list"]', "JSON object"),
        ('{"text": "wrong key"}', "needs a \"prompt\" or \"messages\""),
        ('{"prompt": ""}', "non-empty string"),
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "not both"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "messages\\[0\\] must be an object"),
    ],
)
def test_bad_line_is_bad_input_naming_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "one"}\n{"prompt": "two"}\n' + line + "\n")
    with pytest.raises(BadInput, match=message) as e:
        load_prompts(f)
    assert e.value.where == f"{f}:3"
    assert e.value.exit_code == 2


def test_empty_or_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("\n\n")
    with pytest.raises(BadInput, match="holds no prompts"):
        load_prompts(f)
    with pytest.raises(BadInput, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")
