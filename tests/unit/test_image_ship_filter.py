"""The node-side ship programs (sparkserve/image/ship_node.py) run here as real processes, with a `docker`
that prints a save tar and one that records what `docker load` received: each target gets every member but
the layers its ChainIDs say it holds, in parallel, over real TCP."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from sparkserve.image.identity import chain_ids
from sparkserve.image.ship_node import recv_program, send_program


def _layer(content: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("file")
        ti.size = len(content)
        tf.addfile(ti, io.BytesIO(content))
    return buf.getvalue()


def _save_tar(layers: list[bytes]) -> bytes:
    """A legacy (docker <= 24) save: <v1id>/layer.tar per layer (named by v1 ID, not digest), manifest last."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))

        for i, data in enumerate(layers):
            add(f"v1id{i}/VERSION", b"1.0")
            add(f"v1id{i}/layer.tar", data)
        add("config.json", b"{}")
        add("manifest.json", json.dumps([{"Layers": [f"v1id{i}/layer.tar" for i in range(len(layers))]}]).encode())
    return buf.getvalue()


def _fake_docker(tmp: Path, save: bytes) -> Path:
    (tmp / "save.tar").write_bytes(save)
    exe = tmp / "docker"
    exe.write_text(f"""#!{sys.executable}
import shutil, sys
if sys.argv[1] == "save":
    with open({str(tmp / "save.tar")!r}, "rb") as f:
        shutil.copyfileobj(f, sys.stdout.buffer)
elif sys.argv[1] == "load":
    out = {str(tmp)!r} + "/loaded-" + str(__import__("os").getppid()) + ".tar"
    with open(out, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f)
    print("Loaded image: x")
""")
    exe.chmod(0o755)
    return exe


def test_each_target_gets_only_the_layers_it_lacks(tmp_path: Path) -> None:
    layers = [_layer(b"a" * 5000), _layer(b"b" * 7000), _layer(b"c" * 3000)]
    diffs = ["sha256:" + hashlib.sha256(x).hexdigest() for x in layers]
    chains = chain_ids(diffs)
    docker = _fake_docker(tmp_path, _save_tar(layers))
    targets = [{"name": "has-two", "token": "t1", "have_chains": chains[:2]},
               {"name": "has-none", "token": "t2", "have_chains": []},
               {"name": "other-parent", "token": "t3", "have_chains": chain_ids([diffs[1]])}]
    job = tmp_path / "job"
    sender = subprocess.Popen(send_program({"ref": "x:1", "layers": diffs, "workdir": str(job), "bind": "127.0.0.1",
                                            "docker": str(docker), "targets": targets}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if (job / "port").exists():
            break
        time.sleep(0.05)
    port = int((job / "port").read_text())
    outs = {}
    recvs = {}
    for t in targets:
        d = tmp_path / t["name"]
        d.mkdir()
        recvs[t["name"]] = subprocess.Popen(recv_program({"host": "127.0.0.1", "port": port, "token": t["token"],
                                                          "docker": str(_fake_docker(d, b""))}),
                                            stdout=subprocess.PIPE, text=True)
    for name, p in recvs.items():
        out, _ = p.communicate(timeout=60)
        outs[name] = json.loads(out.strip().splitlines()[-1])
        assert outs[name]["load_rc"] == 0
    summary = json.loads(sender.communicate(timeout=60)[0].strip().splitlines()[-1])
    assert summary["save_rc"] == 0

    def received(name: str) -> dict[str, bytes]:
        (loaded,) = (tmp_path / name).glob("loaded-*.tar")
        with tarfile.open(loaded) as tf:
            return {m.name: tf.extractfile(m).read() for m in tf if m.isfile()}  # type: ignore[union-attr]

    assert [n for n in received("has-two") if n.endswith("layer.tar")] == ["v1id2/layer.tar"]
    assert received("has-two")["v1id2/layer.tar"] == layers[2]
    assert {n for n in received("has-none") if n.endswith("layer.tar")} == {f"v1id{i}/layer.tar" for i in range(3)}
    assert received("has-none")["v1id1/layer.tar"] == layers[1]
    # holding layer b on another parent is not holding this image's layer b
    assert {n for n in received("other-parent") if n.endswith("layer.tar")} == {f"v1id{i}/layer.tar" for i in range(3)}
    assert "manifest.json" in received("has-two") and "config.json" in received("has-two")
    assert summary["skipped"]["has-two"] == len(layers[0]) + len(layers[1]) and summary["skipped"]["has-none"] == 0
    sent = summary["sent"]
    assert sent["has-two"] < sent["has-none"] - len(layers[0]) - len(layers[1]) + 2048
    for name in sent:  # what the sender counts is what the target's `docker load` read
        assert sent[name] == (tmp_path / name / next((tmp_path / name).glob("loaded-*.tar")).name).stat().st_size
