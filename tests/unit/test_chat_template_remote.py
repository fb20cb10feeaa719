"""The target's chat template read from the head (deploy/chat_template_remote.py), over a real node (LocalNode runs
the same node program over the same Node interface the SSH node does; the rig test runs it over SSH)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.config import load_config
from sparkserve.deploy.chat_template_remote import cache_root, head_template_dir, needs_remote_template
from sparkserve.errors import BadInput
from sparkserve.measure.chat_template import load_chat_template
from sparkserve.nodes.local import LocalNode

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<a>{% endif %}")


def _cfg(target: Path):  # noqa: ANN202
    cfg = load_config(None)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"target": target})})


def test_the_head_copy_is_fetched_once_cached_by_manifest_and_fetched_again_when_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = tmp_path / "head" / "target"
    target.mkdir(parents=True)
    (target / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "chat_template": "old"}))
    (target / "chat_template.jinja").write_text(TEMPLATE)
    cfg = _cfg(target)
    said: list[str] = []
    head = LocalNode("spark-a")
    got = head_template_dir(cfg, head, say=said.append)
    assert got.parent == cache_root() and len(said) == 1 and "read from spark-a" in said[0]
    tpl = load_chat_template(got)
    assert tpl.render_user("hi") == "<user>hi<a>" and tpl.special_tokens["eos_token"] == "<eos>"
    assert head_template_dir(cfg, head, say=said.append) == got and len(said) == 1  # the cache answers
    (target / "chat_template.jinja").write_text(TEMPLATE.replace("<a>", "<assistant>"))
    assert head_template_dir(cfg, head, say=said.append) == got and len(said) == 2  # changed on the head: again
    assert load_chat_template(got).render_user("hi") == "<user>hi<assistant>"
    (target / "chat_template.jinja").unlink()  # gone on the head: gone from the copy (tokenizer_config's wins)
    assert head_template_dir(cfg, head, say=said.append) == got and not (got / "chat_template.jinja").exists()


def test_no_such_target_on_the_head_names_model_target_and_the_override(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path / "nowhere")
    assert needs_remote_template(cfg)
    with pytest.raises(BadInput) as e:
        head_template_dir(cfg, LocalNode("spark-a"))
    assert e.value.where == "model.target" and "spark-a" in e.value.what and "--chat-template" in e.value.what
    assert not needs_remote_template(_cfg(tmp_path))  # a directory this machine has: read here, as before


class _ElsewhereNode(LocalNode):
    """The head as another machine: its ``/srv/head-only`` is this test's directory (the node program is the
    real one, run here; only the root it is handed moves), so ``model.target`` is not on this machine."""

    def __init__(self, name: str, root: Path) -> None:
        super().__init__(name)
        self.root = root

    def run(self, argv, **kw):  # noqa: ANN001, ANN003, ANN201
        if kw.get("stdin"):
            kw["stdin"] = kw["stdin"].replace(b"/srv/head-only", str(self.root).encode())
        return super().run(argv, **kw)

    def get(self, remote: str, local: Path) -> None:
        super().get(remote.replace("/srv/head-only", str(self.root)), local)


def test_an_ab_campaign_reads_the_template_from_the_head_when_the_target_is_not_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ab run --protocol card` from a laptop (issue 41 item 6, as `bench` does): no --chat-template needed."""
    from sparkserve.campaign.spec import CampaignRequest, campaign_template, check_request
    from sparkserve.commands.measure import cell_specs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    cfg = _cfg(Path("/srv/head-only/target"))
    assert needs_remote_template(cfg)
    head = _ElsewhereNode(cfg.head.name, tmp_path)
    cells = cell_specs("smoke", None)
    arms = [("a", {"serve.max_num_seqs": 4}), ("b", {"serve.max_num_seqs": 6})]
    check_request(cfg, CampaignRequest(drafters=[], cells=cells, variants=arms))
    tpl = campaign_template(cfg, {cfg.head.name: head}, None)
    assert tpl.render_user("hi") == "<user>hi<a>" and Path(tpl.source).is_relative_to(cache_root())
    with pytest.raises(BadInput) as e:  # an explicit --chat-template still wins, and is still checked
        check_request(cfg, CampaignRequest(drafters=[], cells=cells, variants=arms,
                                           chat_template=tmp_path / "missing"))
    assert e.value.where == "--chat-template"
