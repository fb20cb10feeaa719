"""`sparkserve bundle` (issue 24): one tar.gz for a bug report; no planted secret survives anywhere in it, and
`--redact-hosts` hides host names and IP addresses too. The nodes here do not resolve: every node part is
recorded in errors.json and the bundle is still written (the rig test bundles a running stack)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from _fixtures import clean_env, cli, config_file

from sparkserve.operate.bundle import redact_config_text, scrub, secret_values

API_KEY = "sk-live-4f9a1c2e8b7d6a5f"
TOKEN = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456"
PASSWORD = "correct-horse-battery-staple-42"
HOSTS = ("spark-a.invalid", "spark-b.invalid")
IPS = ("192.168.200.11", "192.168.200.12")


def _config(tmp_path: Path) -> Path:
    key = tmp_path / "api.key"
    key.write_text(API_KEY + "\n")
    nodes = [{"name": "spark-a", "host": HOSTS[0], "fabric_ip": IPS[0]},
             {"name": "spark-b", "host": HOSTS[1], "fabric_ip": IPS[1]}]
    f = config_file(tmp_path / "sparkserve.yaml", {
        "nodes": nodes,
        "serve": {"api_key_file": str(key), "env": {"HF_TOKEN": TOKEN, "REGISTRY_PASSWORD": PASSWORD}},
        "ssh": {"connect_timeout_s": 2, "identity_file": None},
    })
    f.write_text(f.read_text() + f"# my notes: the registry password is {PASSWORD}\n")
    return f


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_no_planted_secret_survives_anywhere_in_the_bundle(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    out = tmp_path / "b.tar.gz"
    p = cli("bundle", "-c", str(cfg), "-o", str(out), env=clean_env(tmp_path), timeout=180)
    assert p.returncode == 0, p.stderr
    assert f"wrote {out}" in p.stdout
    members = _members(out)
    names = {n.split("/", 1)[1] for n in members}
    assert {"config.yaml", "config-effective.json", "plan.json", "errors.json", "README.txt", "versions.json",
            "journal.json", "image-lock.json"} <= names, names
    for name, data in members.items():
        for secret in (API_KEY, TOKEN, PASSWORD):
            assert secret.encode() not in data, f"{secret} survived in {name}"
    raw = members[next(n for n in members if n.endswith("/config.yaml"))].decode()
    assert "HF_TOKEN: <redacted>" in raw and "REGISTRY_PASSWORD: <redacted>" in raw
    assert "served_name: glm-5.3-flash" in raw  # the rest is the user's file as it is
    for name, data in members.items():  # scrubbing never breaks a JSON member
        if name.endswith(".json"):
            json.loads(data)
    errors = json.loads(members[next(n for n in members if n.endswith("/errors.json"))])
    assert "node spark-a" in errors and "node spark-b" in errors, errors  # unreachable: named, not fatal
    versions = json.loads(members[next(n for n in members if n.endswith("/versions.json"))])
    assert versions["sparkserve"] and versions["image_ref"].startswith("ghcr.io/")


def test_redact_hosts_hides_host_names_and_ips(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    out = tmp_path / "b.tar.gz"
    p = cli("bundle", "-c", str(cfg), "-o", str(out), "--redact-hosts", env=clean_env(tmp_path), timeout=180)
    assert p.returncode == 0, p.stderr
    for name, data in _members(out).items():
        for h in (*HOSTS, *IPS):
            assert h.encode() not in data and h not in name, f"{h} survived in {name}"
    plain = tmp_path / "plain.tar.gz"
    assert cli("bundle", "-c", str(cfg), "-o", str(plain), env=clean_env(tmp_path), timeout=180).returncode == 0
    assert any(HOSTS[0].encode() in d for d in _members(plain).values()), "without the flag, hosts stay"


def test_the_redaction_rules_can_fail() -> None:
    data = {"serve": {"env": {"MY_TOKEN": "abcdef", "PATH": "/usr/bin"}, "port": 8000}, "auth": {"password": "pw12"},
            "gates": {"pool_tokens": 366749, "mask_token_id": 154856, "smoke": {"max_tokens": 512}},
            "ssh": {"accept_new_host_keys": True}}
    assert secret_values(data, None) == {"abcdef", "pw12"}  # a token count is no token
    text = "serve:\n  env:\n    MY_TOKEN: abcdef   # keep\n    PATH: /usr/bin\n"
    assert redact_config_text(text) == "serve:\n  env:\n    MY_TOKEN: <redacted>   # keep\n    PATH: /usr/bin\n"
    assert scrub("ssh 10.1.2.3 then 127.0.0.1 and spark-a.lan:22", set(), {"spark-a.lan": "host-1"}) == \
        "ssh ip-1 then 127.0.0.1 and host-1:22"
    assert scrub("v0.33.0 and 1.2.3", set(), {}) == "v0.33.0 and 1.2.3"
