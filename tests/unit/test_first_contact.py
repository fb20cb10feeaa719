"""The first contact of a new user (issue 24): each stumble measured on the rig, as a test that failed before.

No config file, init's placeholder hosts, a misspelt key, an empty file, a wrong path, the config file's
layout after a swap, `status` for people, `doctor` on its own running stack.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from _fixtures import REPO, clean_env, cli, config_file

from sparkserve.config import load_config
from sparkserve.errors import BadInput

DEFAULT = REPO / "sparkserve" / "data" / "default.yaml"


def test_no_config_file_is_exit_2_naming_the_dir_and_init(tmp_path: Path) -> None:
    for args in (["status"], ["doctor"], ["validate"], ["down"], ["gates"], ["status", "--json"]):
        p = cli(*args, env=clean_env(tmp_path), cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        line = p.stderr.strip().splitlines()[0]
        assert line == (f"error: config: no sparkserve.yaml in {tmp_path} (or -c / SPARKSERVE_CONFIG); "
                        "run `sparkserve init`"), (args, p.stderr)
        assert "ssh-keyscan" not in p.stderr and "spark-a.lan" not in p.stderr


def test_an_untouched_init_file_names_its_hosts_as_placeholders(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    assert cli("init", env=env, cwd=tmp_path).returncode == 0
    for args in (["status"], ["validate"], ["doctor", "--json"]):
        p = cli(*args, env=env, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.startswith("error: nodes.0.host: spark-a.lan is a placeholder from `sparkserve init`"), p.stderr
        assert "nodes.1.host: spark-b.lan is a placeholder too" in p.stderr
        assert "ssh-keyscan" not in p.stderr
    # validate --offline touches no node: the placeholders do not matter there
    p = cli("validate", "--offline", env=env, cwd=tmp_path)
    assert "placeholder" not in p.stderr


def test_a_misspelt_key_is_named_with_its_line_and_a_suggestion(tmp_path: Path) -> None:
    text = DEFAULT.read_text().replace("\ndrafter:", "\ndrafer:").replace("  port: 8000", "  prot: 8000")
    f = tmp_path / "sparkserve.yaml"
    f.write_text(text)
    lines = text.splitlines()
    drafer_line = next(i for i, ln in enumerate(lines, 1) if ln.startswith("drafer:"))
    prot_line = next(i for i, ln in enumerate(lines, 1) if ln.startswith("  prot:"))
    with pytest.raises(BadInput) as e:
        load_config(f)
    every = [f"{e.value.where}: {e.value.what}", *e.value.details]
    assert any(x.startswith("drafer: unknown field; did you mean `drafter`?") and f"line {drafer_line})" in x
               for x in every), every
    assert any(x.startswith("serve.prot: unknown field; did you mean `port`?") and f"line {prot_line})" in x
               for x in every), every
    assert any(x.startswith("drafter: is required") for x in every), every
    assert e.value.where != "drafter", "the unknown key explains the missing one: it comes first"
    # --json carries every problem in "details"
    p = cli("validate", "--json", "-c", str(f), env=clean_env(tmp_path))
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and len(doc["error"]["details"]) == 2, doc
    assert p.stderr.count("did you mean") == 2


def test_an_empty_config_says_empty(tmp_path: Path) -> None:
    f = tmp_path / "sparkserve.yaml"
    for text in ("", "# only a comment\n"):
        f.write_text(text)
        with pytest.raises(BadInput) as e:
            load_config(f)
        assert e.value.where == str(f) and "empty" in e.value.what and "is required" not in e.value.what


def test_a_wrong_config_path_does_not_exist_and_suggests_a_near_name(tmp_path: Path) -> None:
    config_file(tmp_path / "sparkserve.yaml")
    p = cli("status", "-c", str(tmp_path / "sparkserve.yml"), env=clean_env(tmp_path))
    assert p.returncode == 2
    assert p.stderr.strip() == (f"error: {tmp_path / 'sparkserve.yml'}: does not exist; did you mean "
                                f"{tmp_path / 'sparkserve.yaml'}?")


def test_a_wrong_drafter_path_does_not_exist_and_suggests_a_near_name(tmp_path: Path) -> None:
    from sparkserve.deploy.swap import swap_drafter

    (tmp_path / "dflash2-e").mkdir()
    (tmp_path / "a-file").write_text("x")
    cfg = load_config(DEFAULT)
    with pytest.raises(BadInput) as e:
        swap_drafter(cfg, {}, tmp_path / "dflash2-f")  # no node: it must fail before reaching one
    assert (e.value.where, e.value.what) == (str(tmp_path / "dflash2-f"),
                                             f"does not exist; did you mean {tmp_path / 'dflash2-e'}?")
    with pytest.raises(BadInput) as e:
        swap_drafter(cfg, {}, tmp_path / "a-file")
    assert e.value.what.startswith("is not a directory")


def test_the_config_written_after_a_swap_keeps_its_layout(tmp_path: Path) -> None:
    from sparkserve.deploy.active_drafter import write_config_drafter

    f = tmp_path / "sparkserve.yaml"
    f.write_text(DEFAULT.read_text())
    write_config_drafter(f, "/models/new-0123456789ab", Path("/home/me/new"))
    diff = [ln for ln in difflib.unified_diff(DEFAULT.read_text().splitlines(), f.read_text().splitlines(),
                                              lineterm="", n=0) if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert diff == [
        "-  path: /models/GLM-5.3-Flash-DFlash2-G   # host path, same on every node, mounted read-only (-F, -E: "
        "drop-in)",
        "+  path: /models/new-0123456789ab          # host path, same on every node, mounted read-only (-F, -E: "
        "drop-in)",
        "+  source: /home/me/new",
    ], diff
    assert "  - name: spark-a" in f.read_text()  # the nodes: list keeps its indentation


def _status(started: str = "2026-12-01T11:42:24.123456789Z", verdict: bool | None = True):  # type: ignore[no-untyped-def]
    from sparkserve.deploy.serving import Serving
    from sparkserve.deploy.stack import ApiStatus, ContainerStatus, StackStatus

    long_name = "sparkserve-0123456789abcdef-spark-a-with-a-long-node-name-r0"
    cs = ContainerStatus(long_name, "0123456789ab", 0, "head", "running", "fedcba987654", "sha256:8e3f0a1b2c3d")
    cf = ContainerStatus(long_name.replace("r0", "r1"), "ba9876543210", 1, "follower", "running", "fedcba987654",
                         "sha256:8e3f0a1b2c3d")
    st = StackStatus({"spark-a": [cs], "spark-b": [cf]}, ApiStatus("http://10.0.0.1:8000", True, ["glm"]), True,
                     ["fedcba987654"], gates=verdict)
    sv = Serving(started_at=started, uptime_s=65, model="glm", target="/models/t", drafter_path="/models/d",
                 drafter_digest="0a1b2c3d4e5f60718293", config_drafter="/models/d", differs=False,
                 image_ref="ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e",
                 image_id="sha256:8e3f0a1b2c3d4e5f", deployment="fedcba987654" * 5, endpoint="http://10.0.0.1:8000/v1")
    return st, sv


def test_status_for_people_never_cuts_an_id_and_says_this_boots_verdict() -> None:
    from sparkserve.commands.deploy import status_lines

    cfg = load_config(DEFAULT)
    st, sv = _status()
    lines = status_lines(cfg, st, sv)
    text = "\n".join(lines)
    assert "…" not in text and "..." not in text
    for ident in (st.nodes["spark-a"][0].name, st.nodes["spark-b"][0].name, "0123456789ab", "ba9876543210",
                  "fedcba987654", sv.image_ref, "sha256:8e3f0a1b2c3d4e5f"):
        assert ident in text, ident
    assert sum("http://10.0.0.1:8000" in ln for ln in lines) == 1, "the API is named once"
    assert "since 2026-12-01 11:42:24 UTC" in text and "24.123" not in text
    assert "deployment fedcba987654 · gates passed for this boot" in text
    assert "fingerprint" not in text
    assert "gates not judged for this boot" in "\n".join(status_lines(cfg, _status(verdict=None)[0], sv))
    assert "gates FAILED for this boot" in "\n".join(status_lines(cfg, _status(verdict=False)[0], sv))


def test_status_piped_at_80_columns_keeps_every_id_whole(tmp_path: Path) -> None:
    from rich.console import Console

    from sparkserve.commands import deploy

    cfg = load_config(DEFAULT)
    st, sv = _status()
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        deploy.console = Console(file=fh, width=80, no_color=True)  # piped: not a terminal
        try:
            deploy._print_status(cfg, st, sv)
        finally:
            from sparkserve.commands._common import console

            deploy.console = console
    text = out.read_text()
    assert st.nodes["spark-a"][0].name in text and "sha256:8e3f0a1b2c3d4e5f" in text and "…" not in text


def test_doctor_knows_its_own_deployment_from_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkserve.deploy.doctor import own_deployment
    from sparkserve.journal import Journal

    monkeypatch.setenv("SSJOURNAL_PATH", str(tmp_path / "j.sqlite"))
    cfg = load_config(DEFAULT)
    other = load_config(config_file(tmp_path / "o.yaml", {"serve": {"port": 8001}}))
    swapped = cfg.model_copy(deep=True)
    swapped.drafter = swapped.drafter.model_copy(update={"path": Path("/models/new-0123456789ab")})
    with Journal.open() as j:
        j.record_deployment("a" * 64, cfg.normalized(), {"spark-a": "sha256:i"}, "d" * 64, "up+gates")
        j.record_deployment("b" * 64, other.normalized(), {"spark-a": "sha256:i"}, "d" * 64, "up+gates")
        j.record_deployment("c" * 64, swapped.normalized(), {"spark-a": "sha256:i"}, "e" * 64, "up+gates")
    assert own_deployment(cfg, "a" * 64) is True
    assert own_deployment(cfg, "c" * 64) is True, "a swapped drafter is still this config's stack"
    assert own_deployment(cfg, "b" * 64) is False
    assert own_deployment(cfg, "f" * 64) is False and own_deployment(cfg, "") is False


def test_the_copy_bars_go_and_leave_one_line_per_node_and_the_boot_view_ends_when_up_speaks() -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from sparkserve.commands.progress import Progress
    from sparkserve.deploy.watchdog import Phase

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100, color_system=None)
    with Progress(console=con) as p:
        for done in (0, 50, 100):
            p.copy("node-a", done, 100)
            p.copy("node-b", done, 100)
        tail = buf.getvalue()
        assert "node-a: drafter 100 B of 100 B (100%)" in tail and "node-b: drafter 100 B of 100 B (100%)" in tail
        p.boot([SimpleNamespace(node="node-a", rank=0, phase=Phase.LOAD, available=None, last_line="")], 1.0)
        assert p._boot_live is not None
        p.say("the head answers at http://x after 1.0s; the gates decide whether it serves")
        assert p._boot_live is None, "the boot table must stop (and stay printed) before the gates speak"


def test_help_text_wraps_at_the_terminal_not_at_the_docstrings_line_ends(tmp_path: Path) -> None:
    p = cli("up", "--help", env=clean_env(tmp_path, COLUMNS="100"))
    assert p.returncode == 0, p.stderr
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip() and not ln.strip().startswith(("│", "╭", "╰"))]
    assert not [ln for ln in lines if ln in ("(run", "rank")], lines  # the docstring's line ends left these alone
    assert "(run now when the journal holds no verdict for it" in " ".join(lines)
