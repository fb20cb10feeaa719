"""The configuration reference (issue 33): grouped by section, every field with a description and an anchor, the
default beside what `sparkserve init` writes and what the card's launcher runs where they differ, and no table
whose identifiers wrap mid-word."""

from __future__ import annotations

import re
import typing
from typing import Any

import pytest
import yaml
from _fixtures import REPO

from sparkserve.config import Config
from sparkserve.docgen import config as docs_config


@pytest.fixture(scope="module")
def page() -> str:
    return docs_config.config_page()


def _leaves(model: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, f in model.model_fields.items():
        ann, _ = docs_config._unwrap(f.annotation)
        inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        if docs_config._is_model(ann):
            out += _leaves(ann, f"{prefix}{name}.")
        elif inner is not None and docs_config._is_model(docs_config._unwrap(inner)[0]):
            out += [(prefix + name, f), *_leaves(docs_config._unwrap(inner)[0], f"{prefix}{name}[].")]
        else:
            out.append((prefix + name, f))
    return out


def _blocks(page: str) -> dict[str, str]:
    """field → its block (heading to the next heading)."""
    parts = re.split(r"^(### `[^`]+` \{ #[^ ]+ \})$", page, flags=re.M)
    return {re.match(r"### `([^`]+)`", parts[i]).group(1): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_field_has_a_description_in_the_model() -> None:
    empty = [dotted for dotted, f in _leaves(Config) if not (f.description or "").strip()]
    assert empty == [], f"config fields without a pydantic Field description: {empty}"


def test_one_heading_per_section_and_every_field_under_its_own(page: str) -> None:
    sections = re.findall(r"^## (\S+)(?: level)? \{ #section-([\w-]+) \}$", page, re.M)
    names = [n for n, _ in sections]
    for want in ("nodes", "ssh", "fabric", "serve", "serve.compilation", "gates", "gates.smoke", "container",
                 "watchdog", "supervise"):
        assert want in names, want
    bodies = re.split(r"^## \S+(?: level)? \{ #section-[\w-]+ \}$", page, flags=re.M)[1:]
    chunks = dict(zip(names, bodies, strict=True))
    for dotted, _ in _leaves(Config):
        home = dotted.rsplit(".", 1)[0].replace("[]", "") if "." in dotted else (
            dotted if dotted in chunks else "Top")
        assert f"### `{dotted}` {{ #{dotted.replace('[]', '')} }}" in chunks[home], (dotted, home)


def test_every_block_has_type_default_env_and_a_description(page: str) -> None:
    blocks = _blocks(page)
    assert set(blocks) == {d for d, _ in _leaves(Config)}
    anchors = re.findall(r"\{ #([^ ]+) \}", page)
    assert len(anchors) == len(set(anchors)), "anchors repeat"
    for dotted, block in blocks.items():
        paras = [p.strip() for p in block.strip().split("\n\n")]
        assert " · default " in paras[0] and "environment" in paras[0], dotted
        if dotted != "nodes":
            assert len(paras) >= 2 and len(paras[1]) > 10 and paras[1].endswith("."), (dotted, paras)


def test_the_default_the_init_file_and_the_card_where_they_differ(page: str) -> None:
    blocks = _blocks(page)
    assert 'default `"root"`' in blocks["nodes[].user"] and '`sparkserve init` writes `"ubuntu"`' in blocks[
        "nodes[].user"]
    assert "default required" in blocks["image.ref"] and "`sparkserve init` writes `\"ghcr.io/" in blocks["image.ref"]
    assert "The card's launcher: `WARN`" in blocks["fabric.nccl_debug"]
    assert "sparkserve init` writes" not in blocks["serve.port"]  # the same: nothing to say
    assert 'default `8053063680`' in blocks["serve.kv_cache_memory_bytes"]


def test_every_card_value_names_a_field() -> None:
    assert set(docs_config.CARD_VALUES) <= {d for d, _ in _leaves(Config)}


def test_no_table_to_wrap_identifiers_and_the_anchors_render(page: str) -> None:
    assert not [ln for ln in page.splitlines() if ln.startswith("|")]
    exts = yaml.safe_load((REPO / "mkdocs.yml").read_text())["markdown_extensions"]
    assert "attr_list" in exts  # the { #id } of each heading
