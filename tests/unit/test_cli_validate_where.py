"""`validate` reads each model where it is: here when the path exists here, else on the head (as `up` does);
--offline touches no node and says what it did not read; its messages never point at itself."""

from __future__ import annotations

import json
from pathlib import Path

from _fixtures import clean_env, cli, config_file, write_drafter, write_target


def test_offline_checks_the_config_and_names_each_model_it_did_not_read(tmp_path: Path) -> None:
    cfg = config_file(tmp_path / "c.yaml", {"nodes": [
        {"name": "a", "host": "192.0.2.1", "fabric_ip": "10.0.0.1"},
        {"name": "b", "host": "192.0.2.2", "fabric_ip": "10.0.0.2"}]})
    p = cli("validate", "-c", str(cfg), "--offline", "--parser", "list", env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "drafter not read: /models/GLM-5.3-Flash-DFlash2-G is not on this machine (--offline)" in p.stdout
    assert "target not read: /models/GLM-5.3-Flash-W4A16-MTP is not on this machine (--offline)" in p.stdout
    assert "argv ok" in p.stdout


def test_models_on_this_machine_need_no_node_and_say_where_they_were_read(tmp_path: Path) -> None:
    d, t = write_drafter(tmp_path / "d"), write_target(tmp_path / "t")
    cfg = config_file(tmp_path / "c.yaml", {"drafter": {"path": str(d)}, "model": {"target": str(t)}})
    p = cli("validate", "-c", str(cfg), "--parser", "list", "--json", env=clean_env(tmp_path))  # hosts: .lan
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == 1 and doc["ok"] is True
    assert doc["read"] == {"drafter": f"this machine: {d}", "target": f"this machine: {t}"}


def test_a_model_only_on_the_nodes_is_read_on_the_head_and_an_unreachable_head_says_offline(
        tmp_path: Path) -> None:
    cfg = config_file(tmp_path / "c.yaml", {"nodes": [
        {"name": "a", "host": "127.0.0.1", "port": 1, "fabric_ip": "10.0.0.1"},
        {"name": "b", "host": "127.0.0.1", "port": 2, "fabric_ip": "10.0.0.2"}],
        "ssh": {"known_hosts": str(tmp_path / "kh")}})
    (tmp_path / "kh").write_text("")
    env = clean_env(tmp_path)
    (Path(env["HOME"]) / ".ssh").mkdir()
    (Path(env["HOME"]) / ".ssh" / "id_ed25519").write_text("a key\n")
    p = cli("validate", "-c", str(cfg), "--parser", "list", "--json", env=env)
    assert p.returncode == 3
    assert p.stderr.startswith("error: a: ssh: cannot connect to root@127.0.0.1:1: connection refused")
    doc = json.loads(p.stdout)  # --json: one document even so, the error inside it
    assert doc["ok"] is False and doc["error"]["where"] == "a: ssh" and doc["error"]["exit_code"] == 3
    assert "sparkserve validate" not in p.stderr
    assert "  the drafter and target are not on this machine: validate reads them on the head; --offline " \
        "checks without any node" in p.stderr.splitlines()
