"""The card's named profiles as a user meets them: `sparkserve profiles` lists the four, `render --json` of each
renders the card's values (one test per profile), a field the config writes wins and is shown as a difference,
an unknown profile is one line and exit 2, and `mtp` mounts no drafter.

The expected values are the card's (canada-quant/vllm-glm53-flash-sm121, read 2026-12-02): the launcher at
1c142c9 (262144 / 8053063680 / 0.795 defaults; 800000 "with KV_CACHE_MEM=17179869184 GMU=0.90; validated with
-G"), the README's 1M line (1048576, GMU 0.90, 9663676416), the DFlash2-G card's pool table (366,749 · 888,729 ·
1,360,420 tokens) and its MTP advice ({"method":"mtp","num_speculative_tokens":3}).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _fixtures import clean_env, cli, cli_batch, config_file

from sparkserve.config import load_config, profiles

# the card's facts, per profile: (max model len, KV pin bytes, GMU, pool, speculative config, drafter mounted)
CARD = {
    "g4-262k": ("262144", "8053063680", "0.795", 366749,
                {"method": "dflash", "model": "/models/drafter", "num_speculative_tokens": 7}, True),
    "long-800k": ("800000", "17179869184", "0.9", 888729,
                  {"method": "dflash", "model": "/models/drafter", "num_speculative_tokens": 7}, True),
    "mtp": ("262144", "8053063680", "0.795", None, {"method": "mtp", "num_speculative_tokens": 3}, False),
    "incoai-1m": ("1048576", "9663676416", "0.9", 1360420,
                  {"method": "dflash", "model": "/models/drafter", "num_speculative_tokens": 7}, True),
}
NODES = [{"name": "spark-a", "host": "10.0.0.1", "fabric_ip": "192.168.102.1", "user": "ubuntu"},
         {"name": "spark-b", "host": "10.0.0.2", "fabric_ip": "192.168.102.2", "user": "ubuntu"}]


def _cfg(tmp: Path, name: str, over: dict[str, Any] | None = None, drop: list[str] | None = None) -> Path:
    return config_file(tmp / f"{name}.yaml", {"profile": name, "nodes": NODES, **(over or {})}, drop=drop)


def _args(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            out[a] = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
    return out


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("profiles")
    env = clean_env(tmp)
    jobs = [(["render", "--json", "-c", str(_cfg(tmp, name, drop=["drafter"] if name == "mtp" else None))], env)
            for name in CARD]
    out = {}
    for name, p in zip(CARD, cli_batch(jobs, tmp / "batch"), strict=True):
        assert p.returncode == 0, p.stderr
        out[name] = json.loads(p.stdout)
    return out


def _check(plan: dict[str, Any], name: str) -> None:
    mml, kv, gmu, _pool, spec, mounted = CARD[name]
    assert plan["profile"] == {"name": name, "explicit": True, "overrides": []}
    for s in plan["specs"]:
        a = _args(s["command"])
        assert (a["--max-model-len"], a["--kv-cache-memory"], a["--gpu-memory-utilization"]) == (mml, kv, gmu)
        assert json.loads(a["--speculative-config"] or "") == spec
        assert ("/models/drafter" in {m["target"] for m in s["mounts"]}) is mounted
        assert s["shm_size"] == 32 * 2**30  # the launcher's --shm-size 32g beside --ipc host


def test_render_g4_262k_is_the_cards_banked_launcher(renders: dict[str, Any]) -> None:
    _check(renders["g4-262k"], "g4-262k")


def test_render_long_800k_is_the_launchers_800k_knobs(renders: dict[str, Any]) -> None:
    _check(renders["long-800k"], "long-800k")


def test_render_mtp_is_the_built_in_head_without_a_drafter(renders: dict[str, Any]) -> None:
    _check(renders["mtp"], "mtp")


def test_render_incoai_1m_is_the_readmes_1m_line(renders: dict[str, Any]) -> None:
    _check(renders["incoai-1m"], "incoai-1m")


@pytest.mark.parametrize("name", list(CARD))
def test_each_profile_sets_the_pool_gate_to_the_cards_pool(tmp_path: Path, name: str) -> None:
    cfg = load_config(_cfg(tmp_path, name, drop=["drafter"] if name == "mtp" else None))
    assert cfg.gates.pool_tokens == CARD[name][3]
    assert cfg.gates.mask_token_id == (154856 if name in ("g4-262k", "long-800k") else None)
    assert (cfg.drafter is None) is (name == "mtp")


def test_profiles_lists_the_four_with_their_values(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    p = cli("profiles", env=env)
    assert p.returncode == 0, p.stderr
    rows = {ln.split("│")[1].strip().rstrip(" *"): ln for ln in p.stdout.splitlines() if ln.count("│") > 3}
    assert set(rows) >= set(CARD)
    assert "8053063680" in rows["g4-262k"] and "366,749" in rows["g4-262k"] and "0.795" in rows["g4-262k"]
    assert "17179869184" in rows["long-800k"] and "888,729" in rows["long-800k"] and "-G" in rows["long-800k"]
    assert "mtp K=3" in rows["mtp"] and "banked" in rows["mtp"]
    assert "9663676416" in rows["incoai-1m"] and "1,360,420" in rows["incoai-1m"]
    assert "CC-BY-NC-ND-4.0" in p.stdout  # the reference drafter's licence is named
    assert "g4-262k *" in p.stdout and "profile g4-262k (the default)" in p.stdout
    j = cli("profiles", "--json", env=env)
    data = json.loads(j.stdout)
    got = {x["name"]: x["values"] for x in data["profiles"]}
    assert list(got) == list(CARD)
    assert got["long-800k"]["serve.kv_cache_memory_bytes"] == 16 * 2**30
    assert got["mtp"]["speculative.method"] == "mtp" and got["mtp"]["gates.pool_tokens"] is None


def test_a_field_the_config_writes_wins_and_is_shown(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "long-800k", {"serve": {"gpu_memory_utilization": 0.85}})
    c = load_config(cfg)
    assert c.serve.gpu_memory_utilization == 0.85 and c.serve.max_model_len == 800000
    assert profiles.overrides(c) == [("serve.gpu_memory_utilization", 0.90, 0.85)]
    env = clean_env(tmp_path)
    p = cli("profiles", "-c", str(cfg), env=env)
    assert "serve.gpu_memory_utilization: 0.85 (the profile's: 0.9)" in p.stdout
    r = json.loads(cli("render", "--json", "-c", str(cfg), env=env).stdout)
    assert r["profile"]["overrides"] == [{"field": "serve.gpu_memory_utilization", "profile": 0.9, "config": 0.85}]
    assert _args(r["specs"][0]["command"])["--gpu-memory-utilization"] == "0.85"


def test_an_unknown_profile_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = cli("render", "-c", str(_cfg(tmp_path, "long-1m")), env=clean_env(tmp_path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("error: profile: unknown profile 'long-1m'") and "incoai-1m" in p.stderr


def test_dflash_needs_a_drafter_and_mtp_does_not(tmp_path: Path) -> None:
    p = cli("render", "-c", str(_cfg(tmp_path, "g4-262k", drop=["drafter"])), env=clean_env(tmp_path))
    assert p.returncode == 2 and p.stderr.startswith("error: drafter: is required")
    assert load_config(_cfg(tmp_path, "mtp", drop=["drafter"])).drafter is None


def test_the_default_profile_leaves_the_fingerprint_as_it_was(tmp_path: Path) -> None:
    """No `profile:` renders the g4 values with the fingerprint of a config that wrote them out (banked pools
    of existing deployments stay theirs); naming a profile is another deployment."""
    written = {"serve": {"max_model_len": 262144, "gpu_memory_utilization": 0.795,
                         "kv_cache_memory_bytes": 8053063680},
               "gates": {"pool_tokens": 366749, "mask_token_id": 154856},
               "speculative": {"method": "dflash", "num_speculative_tokens": 7}}
    a = load_config(config_file(tmp_path / "a.yaml", {"nodes": NODES}))
    b = load_config(config_file(tmp_path / "b.yaml", {"nodes": NODES, **written}))
    c = load_config(_cfg(tmp_path, "g4-262k"))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_mtp_on_the_cards_fork_requires_no_drafter_group_line(tmp_path: Path) -> None:
    """The fork's signature: the sparse-MLA layout line on every rank; the DFLASH2-DRAFTER-GROUP line names the
    drafter's layers, and an MTP stack has no drafter: it is not required there (it is for every DFlash profile)."""
    from sparkserve.observe.gate_inputs import Expectations

    mtp = Expectations.from_config(load_config(_cfg(tmp_path, "mtp", drop=["drafter"])))
    g4 = Expectations.from_config(load_config(_cfg(tmp_path, "g4-262k")))
    assert [s.name for s in g4.signature] == [s.name for s in mtp.signature] + ["drafter-group"]
    assert all("{drafter_layers}" not in s.line for s in mtp.signature) and mtp.signature
