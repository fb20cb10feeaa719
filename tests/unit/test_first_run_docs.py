"""From nothing to a first run (issue 33): the weights named as the card names them, an install page whose
commands work as written, and one gate story in the CLI, the docs, the README and the JSON."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from _fixtures import REPO, clean_env, cli

from sparkserve.config import load_config
from sparkserve.docgen import gen as docs_gen
from sparkserve.observe.gate_report import CARD_GATES, EXTRA_GATES, GATE_NAMES, gate_story

INSTALL = REPO / "docs" / "getting-started" / "install.md"
# the card's README (canada-quant/vllm-glm53-flash-sm121 README.md@00d42fa): "TL;DR" and "Prerequisites"
# the drafter: -G, the card's Spark drafter of record and its launcher's default (issue 35)
CARD_TARGET, CARD_DRAFTER = "canada-quant/GLM-5.3-Flash-W4A16-MTP", "canada-quant/GLM-5.3-Flash-DFlash2-G"
CARD_SIZES = ("~178 GiB", "~6.2 GB", "~21 GB", "~200 GiB per node")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _bash_blocks(text: str) -> list[str]:
    return [ln for b in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in b.splitlines()]


def _docs() -> dict[Path, str]:
    return {p: p.read_text() for p in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]}


def test_the_weights_are_the_cards_repos_with_sizes_and_the_default_paths() -> None:
    cfg = load_config()
    for page in (INSTALL, REPO / "README.md"):
        text = page.read_text()
        downloads = [ln for ln in _bash_blocks(text) if "download" in ln]
        # one download per model, into the path the init file's config serves it from
        assert any(f"download {CARD_TARGET} --local-dir {cfg.model.target}" in ln for ln in downloads), page
        assert any(f"download {CARD_DRAFTER} --local-dir {cfg.drafter.path}" in ln for ln in downloads), page
        assert f"docker pull {cfg.image.ref}" in text, page
    text = INSTALL.read_text()
    for size in CARD_SIZES:
        assert size in text, size
    assert "https://github.com/canada-quant/vllm-glm53-flash-sm121" in text
    hf = (REPO / "docs" / "how-to" / "hf-cache.md").read_text()
    assert CARD_TARGET in hf and "zai-org/GLM-5.3-Flash-W4A16" not in hf


def test_no_page_points_at_a_home_that_does_not_exist() -> None:
    for path in [*_docs(), REPO / "pyproject.toml", REPO / "mkdocs.yml"]:
        text = path.read_text()
        assert "github.com/sparkserve/sparkserve" not in text and "sparkserve.github.io" not in text, path
    assert "urls" not in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_no_placeholder_in_a_command_to_paste() -> None:
    for path in (INSTALL, REPO / "README.md", REPO / "docs" / "how-to" / "hf-cache.md"):
        for line in _bash_blocks(path.read_text()):
            cmd = line.split("  #")[0]
            assert not re.search(r"<[A-Za-z][^>]*>|…|\bORG/NAME\b|\bYOUR_", cmd), (path.name, line)


def test_the_install_page_is_first_and_its_wheel_is_the_one_pip_wheel_writes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wheel = f"dist/{project['name']}-{project['version']}-py3-none-any.whl"  # hatchling: a pure-Python wheel
    lines = _bash_blocks(INSTALL.read_text())
    assert any(ln.startswith("pip wheel --no-deps -w dist .") and wheel in ln for ln in lines)
    assert any(ln.startswith(f"pip install {wheel}") for ln in lines)
    assert any(ln.startswith("pip install --no-index --find-links wheelhouse sparkserve") for ln in lines)
    index = (REPO / "docs" / "index.md").read_text()
    first = re.search(r"## Where to start\n\n- (.*)", index)
    assert first and "getting-started/install.md" in first.group(1)
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    started = next(x["Getting started"] for x in nav if isinstance(x, dict) and "Getting started" in x)
    assert list(started[0].values()) == ["getting-started/install.md"]
    # the README's first screen keeps its two set-up commands, exactly
    head = (REPO / "README.md").read_text().splitlines()[2:6]
    assert head[1].startswith("scripts/demo    # try it without a Spark") and head[2].startswith("scripts/test    #")


def test_one_gate_story_in_cli_docs_readme_and_json(tmp_path: Path) -> None:
    story = gate_story()
    assert (*CARD_GATES, *EXTRA_GATES) == GATE_NAMES and len(CARD_GATES) == 5  # the card's "all five"
    for page in (REPO / "README.md", REPO / "docs" / "index.md", REPO / "docs" / "concepts" / "gates.md"):
        assert story in _flat(page.read_text()), page
    p = cli("gates", "--help", env=clean_env(tmp_path, COLUMNS="400"))
    helptext = _flat(re.sub(r"[│╭╮╰╯─]", " ", p.stdout))
    assert story in helptext
    assert "pool graphs mask smoke faults runner signature identity" in helptext  # --skip's list
    assert story in _flat(docs_gen.cli_page())
    # the concepts page: the card's five under its heading, then the rest, each a row in this order
    gates_md = (REPO / "docs" / "concepts" / "gates.md").read_text()
    card, extra = gates_md.split("## The model card's five")[1].split("## sparkserve's three more")
    assert re.findall(r"^\| `(\w+)` \|", card, re.M) == list(CARD_GATES)
    assert re.findall(r"^\| `(\w+)` \|", extra.split("\n## ")[0], re.M) == list(EXTRA_GATES)
    for name, words in CARD_GATES.items():
        assert f"| `{name}` | {words} |" in card
    # the JSON: the same names, the same order, and its schema names them
    assert [g["name"] for g in docs_gen._gates_doc()["gates"]] == list(GATE_NAMES)
    name = docs_gen.json_schemas()["gates"]["properties"]["gates"]["items"]["properties"]["name"]
    assert name["enum"] == list(GATE_NAMES) and story in name["description"]
