"""The engine dialect is a fact of the image, on the two-node rig (issue 21).

A fork-dialect emulator image (the rig's emulator plus the card fork's option list and engine marker: it
rejects `--kv-cache-memory-bytes`, prints the card's two signature lines on every rank and the card's pool for
its bytes) against the rig's own vLLM-0.33 emulator image:

* `image verify` reads each image's dialect from inside it, and `render` follows the image: the fork image →
  `--kv-cache-memory 8053063680`; the 0.33 image → `--kv-cache-memory-bytes 8053063680`;
* with the fork image, `up` with the card's bytes passes every gate: `signature` and `pool` (366,749) included;
* an image whose dialect lacks a configured flag is refused before boot (exit 2, the field and the image named).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.rig

FORK = "0.1.dev20051+g487ecf187"
FORK_REF = "sparkserve-emu/vllm:fork-emu"
NO_BLOCK_REF = "sparkserve-emu/vllm:no-block-size-emu"
FRESH_REF = "sparkserve-emu/vllm:fork-emu-unverified"
CARD_BYTES, CARD_POOL = 8053063680, 366749


@pytest.fixture(scope="module")
def fork_image(rig_exclusive, rig_docker) -> str:
    """The fork-dialect emulator image on every node (built on node-a, shipped by docker save | load); its ID."""
    import rig as riglib

    from sparkserve.plan.dialects import shipped

    files = {"opt/sparkserve-emu/serve-args.json": json.dumps(shipped(FORK).options).encode(),
             "opt/sparkserve-emu/engine": b"glm53-fork\n"}
    names = [n.name for n in rig_exclusive.nodes]
    image_id = riglib.build_image(rig_docker[names[0]], FORK_REF, rig_exclusive.image_ref, files)
    data = b"".join(rig_docker[names[0]].images.get(FORK_REF).save(named=True))
    for n in names[1:]:
        rig_docker[n].images.load(data)
        assert rig_docker[n].images.get(FORK_REF).id == image_id
    yield image_id
    for n in names:
        for ref in (FORK_REF, NO_BLOCK_REF, FRESH_REF):
            with contextlib.suppress(Exception):  # already gone
                rig_docker[n].images.remove(ref)


def _kv(render: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for spec in render["specs"]:
        argv = spec["command"]
        i = next(i for i, a in enumerate(argv) if a.startswith("--kv-cache-memory"))
        out.append((argv[i], argv[i + 1]))
    return out


def test_render_follows_the_image_and_the_fork_image_passes_every_gate(e2e, fork_image: str) -> None:
    card = {"serve": {"kv_cache_memory_bytes": CARD_BYTES}, "gates": {"pool_tokens": CARD_POOL}}
    fork_cfg = e2e.config({**card, "image": {"ref": FORK_REF}})
    upstream_cfg = e2e.derive(fork_cfg, {"image": {"ref": e2e.rig.image_ref}, "gates": {"pool_tokens": None}})

    for cfg, name in ((fork_cfg, FORK), (upstream_cfg, "0.33.0")):
        # (exit 1: an emulator image holds no vLLM package, which verify's other facts say; the dialect is read)
        dialect = e2e.json("image", "verify", cfg=cfg, code=None, timeout=300)["dialect"]
        assert (dialect["name"], dialect["how"]) == (name, "vllm --version"), dialect  # read inside the image

    assert _kv(e2e.json("render", cfg=fork_cfg)) == [("--kv-cache-memory", str(CARD_BYTES))] * 2
    assert _kv(e2e.json("render", cfg=upstream_cfg)) == [("--kv-cache-memory-bytes", str(CARD_BYTES))] * 2

    up = e2e.cli("up", "--json", cfg=fork_cfg, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    gates = {g["name"]: g for g in json.loads(up.stdout)["gates"]["gates"]}
    assert all(g["ok"] for g in gates.values()), {n: g["reason"] for n, g in gates.items() if not g["ok"]}
    assert gates["pool"]["observed"] == [CARD_POOL]
    sig = gates["signature"]
    assert sig["expected"]["lines"] == [
        "Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend",
        "DFLASH2-DRAFTER-GROUP: GLM-5-Next fast path engaged with a spec-decode drafter group (drafter_layers="
        f"{_drafter_layers(e2e)},"]
    assert sorted({e["node"] for e in sig["evidence"]}) == ["node-a", "node-b"] and len(sig["evidence"]) == 4
    e2e.cli("down", cfg=fork_cfg)


def test_an_image_whose_dialect_lacks_a_configured_flag_is_refused_before_boot(e2e, fork_image: str,
                                                                              rig_docker) -> None:
    """The image's own parser dump (what `image verify` keeps for an engine whose vllm imports) lacks
    --block-size: `up` refuses the config before any container starts."""
    from sparkserve.image.dialect import remember
    from sparkserve.plan.dialects import shipped

    for n in e2e.rig.nodes:
        rig_docker[n.name].images.get(e2e.rig.image_ref).tag(*NO_BLOCK_REF.split(":"))
    options = json.loads(json.dumps(shipped("0.33.0").options))
    options["options"] = [o for o in options["options"] if "--block-size" not in o["option_strings"]]
    facts = Path(e2e.state) / "sparkserve" / "image-facts.json"
    old = os.environ.get("SPARKSERVE_IMAGE_FACTS")
    os.environ["SPARKSERVE_IMAGE_FACTS"] = str(facts)  # the file the CLI reads (XDG_STATE_HOME/sparkserve)
    try:
        remember(NO_BLOCK_REF, e2e.rig.image_id, {"vllm_version": "0.33.0", "options": options, "how": "parser"})
    finally:
        if old is None:
            os.environ.pop("SPARKSERVE_IMAGE_FACTS")
        else:
            os.environ["SPARKSERVE_IMAGE_FACTS"] = old
    cfg = e2e.config({"image": {"ref": NO_BLOCK_REF}})
    p = e2e.cli("up", cfg=cfg)
    text = e2e.assert_explained(p, code=2, node=None)
    assert "serve.block_size" in text and NO_BLOCK_REF in text and "has no --block-size" in text
    assert e2e.leftovers() == {}  # nothing started on any node


def test_up_reads_the_dialect_of_an_image_it_has_not_seen(e2e, fork_image: str, rig_docker) -> None:
    """No `image verify` for this ref: `up` reads the dialect inside the image itself, once, before it renders."""
    for n in e2e.rig.nodes:
        rig_docker[n.name].images.get(FORK_REF).tag(*FRESH_REF.split(":"))
    cfg = e2e.config({"image": {"ref": FRESH_REF}, "serve": {"kv_cache_memory_bytes": CARD_BYTES},
                      "gates": {"pool_tokens": CARD_POOL}})
    up = e2e.cli("up", cfg=cfg, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"image: engine dialect vLLM {FORK}" in up.stdout + up.stderr
    running = rig_docker[e2e.rig.nodes[0].name].containers.list(filters={"label": "io.sparkserve.rank=0"})
    argv = running[0].attrs["Config"]["Cmd"]
    assert argv[argv.index("--kv-cache-memory") + 1] == str(CARD_BYTES) and "--kv-cache-memory-bytes" not in argv
    again = e2e.cli("up", cfg=cfg, timeout=300)  # known now: not read again
    assert again.returncode == 0 and "engine dialect" not in again.stdout + again.stderr
    e2e.cli("down", cfg=cfg)


def _drafter_layers(e2e) -> int:
    cfg = json.loads(e2e.rig.head.host_path(e2e.rig.models["drafter"]).joinpath("config.json").read_text())
    return int(cfg["num_hidden_layers"])
