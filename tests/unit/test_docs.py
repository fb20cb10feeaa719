"""The docs (issue 24): the generated reference pages are what the code says now, the README's first screen
keeps the two set-up commands and stays under 10 KB, and every page of the site is in its nav.

When a command, an option, a config field, a JSON contract's key, an error class or a fault pattern changes,
`test_generated_pages_match_the_code` fails until the pages are regenerated: run `scripts/gen-docs`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkserve.docgen import gen as docs_gen

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> dict[Path, str]:
    return docs_gen.pages()


def test_generated_pages_match_the_code(pages: dict[Path, str]) -> None:
    stale = [str(p.relative_to(REPO)) for p, text in pages.items() if not p.is_file() or p.read_text() != text]
    assert not stale, (f"generated docs differ from the code: {', '.join(stale)} — run `scripts/gen-docs` and "
                       "commit the pages")


def test_the_cli_page_has_every_command_and_option(pages: dict[Path, str]) -> None:
    text = pages[docs_gen.DOCS / "reference" / "cli.md"]
    root = docs_gen._click_root()

    def walk(path: list[str], cmd: object) -> None:
        assert f"## `{' '.join(path)}`" in text, path
        for p in getattr(cmd, "params", []):
            if getattr(p, "param_type_name", "") == "option" and p.name not in ("install_completion",
                                                                                 "show_completion"):
                assert f"`{p.opts[0]}`" in text, (path, p.opts)
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk([*path, name], sub)

    for name, cmd in root.commands.items():
        walk(["sparkserve", name], cmd)
    assert "## `sparkserve bundle`" in text and "`--redact-hosts`" in text


def test_the_config_page_has_every_field_with_its_env_var(pages: dict[Path, str]) -> None:
    from pydantic import BaseModel

    from sparkserve.config import Config

    text = pages[docs_gen.DOCS / "reference" / "config.md"]

    def leaves(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            ann, _ = docs_gen._unwrap(f.annotation)
            if docs_gen._is_model(ann):
                out += leaves(ann, f"{prefix}{name}.")
            else:
                out.append(prefix + name)
        return out

    for dotted in leaves(Config, ""):
        assert f"### `{dotted}` {{ #{dotted} }}" in text, dotted
        assert f"`SPARKSERVE_{dotted.upper().replace('.', '__')}`" in text, dotted
    for field in ("serve.ready_timeout_s", "container.cache_root", "watchdog.memory_floor_bytes"):
        assert f"### `{field}`" in text  # the fields the issue found documented nowhere


def test_every_fault_kind_has_advice_on_the_troubleshooting_page(pages: dict[Path, str]) -> None:
    from sparkserve.observe.logpatterns import FaultKind

    text = pages[docs_gen.DOCS / "troubleshooting.md"]
    for kind in FaultKind:
        assert f"### {kind.value} {{ #{kind.value} }}\n" in text and kind.value in docs_gen.FAULT_ADVICE


def test_a_drifted_page_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docs_gen, "DOCS", tmp_path / "docs")
    assert docs_gen.main([]) == 0
    assert docs_gen.drift() == []
    page = tmp_path / "docs" / "reference" / "config.md"
    page.write_text(page.read_text().replace("`serve.port`", "`serve.prot`"))
    assert docs_gen.drift() == ["docs/reference/config.md"]
    assert docs_gen.main(["--check"]) == 1


def test_schema_inference_follows_the_document() -> None:
    s = docs_gen.infer_schema({"ok": True, "checks": [{"node": "a", "n": 1}, {"node": "b", "n": None}]})
    assert s["properties"]["ok"] == {"type": "boolean"}
    assert s["properties"]["checks"]["items"]["properties"]["n"] == {"type": ["integer", "null"]}


def test_readme_first_screen_and_size() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 10 * 1024, len(text.encode())
    first_screen = "\n".join(text.splitlines()[:24])
    assert "scripts/demo" in first_screen and "scripts/test" in first_screen
    for needle in ("pip install", "uv tool install", "ConnectX-7", "NVIDIA container runtime", "Passwordless SSH",
                   "What it guards against", "sparkrun", "eugr", "`vllm serve`", "docs/index.md"):
        assert needle in text, needle


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists() -> None:
    cfg = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def files(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [f for x in nav for f in files(x)]
        if isinstance(nav, dict):
            return [f for v in nav.values() for f in files(v)]
        return []

    in_nav = files(cfg["nav"])
    docs = REPO / "docs"
    assert [f for f in in_nav if not (docs / f).is_file()] == []
    on_disk = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md"))
    assert [f for f in on_disk if f not in in_nav] == [], "a page not in mkdocs.yml's nav"
