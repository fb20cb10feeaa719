"""The node layer without a rig: LocalNode, remote command lines, the rsync transport, the remote
manifest program run as a node would run it, and drafter sync between two local directories."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkserve.config import NodeConfig, SSHConfig
from sparkserve.deploy.sync import remote_manifest, sync_dir
from sparkserve.deploy.sync_remote import remote_program, verify_program
from sparkserve.image.on_nodes import normalize_ref
from sparkserve.models.manifest import manifest
from sparkserve.nodes import LocalNode, Node, NodeError, SSHNode
from sparkserve.nodes.ssh_process import command_line


@pytest.fixture()
def local() -> LocalNode:
    return LocalNode("head")


def test_local_node_satisfies_the_protocol(local: LocalNode) -> None:
    assert isinstance(local, Node)
    assert isinstance(SSHNode(NodeConfig(name="b", host="h", fabric_ip="10.0.0.2"), SSHConfig()), Node)


def test_local_run_takes_argv_without_a_shell(local: LocalNode, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    res = local.run(["echo", f"x; touch {marker}"])
    assert res.stdout == f"x; touch {marker}\n" and not marker.exists()


def test_local_run_errors_name_node_and_step(local: LocalNode) -> None:
    with pytest.raises(NodeError, match=r"^head: probe: sh -c 'exit 4' exited 4"):
        local.run(["sh", "-c", "exit 4"], step="probe")
    assert local.run(["no-such-binary-h5"], check=False).exit_code == 127
    with pytest.raises(NodeError, match="command not found"):
        local.run(["no-such-binary-h5"])


def test_local_timeout_kills_the_process_group(local: LocalNode, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(NodeError, match="timed out after 0.5s"):
        local.run(["sh", "-c", "sleep 31.73 & sleep 31.73"], timeout=0.5)
    assert time.monotonic() - t0 < 3
    out = subprocess.run(["pgrep", "-f", "^sleep 31.73$"], capture_output=True)
    assert out.stdout == b""


def test_local_files_are_written_atomically(local: LocalNode, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"abc")
    dst = tmp_path / "a" / "b" / "dst"
    local.put(src, str(dst), mode=0o600)
    assert dst.read_bytes() == b"abc" and (dst.stat().st_mode & 0o777) == 0o600
    local.write_bytes(str(tmp_path / "w"), b"w")
    assert local.read_text(str(tmp_path / "w")) == "w"
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["dst"]
    with pytest.raises(NodeError, match="^head: read: cannot read"):
        local.read_text(str(tmp_path / "missing"))


def test_ssh_command_line_quotes_every_argument_under_timeout() -> None:
    argv = ["ls", "--", "/m/x; touch /tmp/pwned", "$(id)", "a b"]
    line = command_line(argv, 2.5)
    assert shlex.split(line) == ["timeout", "-k", "3", "3", *argv]


def test_rsync_uses_the_same_key_and_known_hosts_strictly(tmp_path: Path) -> None:
    (tmp_path / "id").write_text("a key file\n")
    ssh = SSHConfig(known_hosts=tmp_path / "kh", identity_file=tmp_path / "id", connect_timeout_s=4,
                    config_file=None)
    node = SSHNode(NodeConfig(name="b", host="127.0.0.3", port=2222, user="ubuntu", fabric_ip="10.0.0.2"), ssh)
    r = node.rsync_remote()
    argv = list(r.ssh_argv)
    assert r.target == "ubuntu@127.0.0.3"
    assert argv[:3] == ["ssh", "-F", "/dev/null"]  # no ssh config file: OpenSSH must not read the user's own
    for opt in (f"UserKnownHostsFile={tmp_path / 'kh'}", "StrictHostKeyChecking=yes", "BatchMode=yes",
                "IdentitiesOnly=no", "ConnectTimeout=4", "HostName=127.0.0.3"):
        assert opt in argv
    assert argv[argv.index("-i") + 1] == str(tmp_path / "id") and argv[argv.index("-p") + 1] == "2222"
    assert shlex.split(r.rsh) == argv


@pytest.mark.parametrize(("ref", "want"), [("foo", "foo:latest"), ("reg:5000/a/b", "reg:5000/a/b:latest"),
                                           ("a/b:1", "a/b:1"), ("a@sha256:00", "a@sha256:00")])
def test_normalize_ref(ref: str, want: str) -> None:
    assert normalize_ref(ref) == want


# -- the remote manifest program and sync, on this machine ------------------------------------------------


@pytest.fixture()
def drafter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPARKSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the node program's cache lives under ~/.cache
    d = tmp_path / "drafter"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(100_000))
    (d / "config.json").write_text("{}\n")
    (d / "sub" / "x.bin").write_bytes(b"x")
    old = time.time() - 60
    for p in d.rglob("*"):
        os.utime(p, (old, old))
    return d


def test_remote_program_is_standalone_and_matches_the_local_manifest(drafter: Path, tmp_path: Path) -> None:
    cache = tmp_path / "c.json"
    args = {"root": str(drafter), "cache": str(cache), "rehash": [], "delete": []}
    out = subprocess.run([sys.executable, "-"], input=remote_program(args).encode(), capture_output=True,
                         check=True, env={"PATH": os.environ["PATH"]})
    data = json.loads(out.stdout)
    want = {r: [e.sha256, e.size] for r, e in manifest(drafter, use_cache=False).files.items()}
    assert data["files"] == want and data["exists"] and data["hashed_bytes"] == 100_000 + 3 + 1
    again = json.loads(subprocess.run([sys.executable, "-"], input=remote_program(args).encode(),
                                      capture_output=True, check=True).stdout)
    assert again["files"] == want and again["hashed_bytes"] == 0  # answered from the cache file


def test_a_cached_only_manifest_reads_no_content_and_names_what_the_cache_cannot_answer(
        drafter: Path, local: LocalNode) -> None:
    cold = remote_manifest(local, str(drafter), cached_only=True)
    assert cold.manifest.hashed_bytes == 0 and sorted(cold.uncached) == ["config.json", "model.safetensors",
                                                                          "sub/x.bin"]
    full = remote_manifest(local, str(drafter))  # hashes everything and fills the node's cache
    warm = remote_manifest(local, str(drafter), cached_only=True)
    assert warm.uncached == [] and warm.manifest.hashed_bytes == 0
    assert warm.manifest.digest == full.manifest.digest == manifest(drafter, use_cache=False).digest
    (drafter / "config.json").write_text('{"changed": 1}\n')
    changed = remote_manifest(local, str(drafter), cached_only=True)
    assert changed.uncached == ["config.json"] and changed.manifest.hashed_bytes == 0


def test_remote_program_refuses_paths_outside_the_root(drafter: Path, local: LocalNode) -> None:
    with pytest.raises(NodeError, match="refusing path"):
        remote_manifest(local, str(drafter), delete=["../escape"])


def test_sync_between_local_dirs_copies_only_what_differs(drafter: Path, tmp_path: Path, local: LocalNode) -> None:
    dst = tmp_path / "dst"
    first = sync_dir(local, drafter, str(dst))
    assert first.method == "copy" and first.verified and len(first.files_copied) == 3
    assert manifest(dst).digest == manifest(drafter).digest
    same = sync_dir(local, drafter, str(dst))
    assert (same.method, same.bytes_copied, same.remote_hashed_bytes) == ("none", 0, 0)
    (drafter / "config.json").write_text('{"a": 1}\n')
    (dst / "extra.txt").write_text("stale")
    r = sync_dir(local, drafter, str(dst))
    assert r.files_copied == ["config.json"] and r.deleted == ["extra.txt"]
    assert manifest(dst).digest == manifest(drafter).digest


def test_sync_onto_itself_is_a_no_op(drafter: Path, local: LocalNode) -> None:
    r = sync_dir(local, drafter, str(drafter))
    assert r.method == "same-dir" and r.bytes_copied == 0 and r.verified


def test_verifier_hashes_files_as_they_land_and_stops_on_eof(drafter: Path, tmp_path: Path,
                                                             local: LocalNode) -> None:
    dst = tmp_path / "landing"
    dst.mkdir()
    (dst / "old.bin").write_bytes(b"old")
    m = manifest(drafter)
    args = {"root": str(dst), "cache": "", "delete": ["old.bin"],
            "files": {r: [e.size, e.sha256] for r, e in m.files.items()}, "before": {}}
    proc = local.start([sys.executable, "-c", verify_program(args)], timeout=30)
    for rel in m.files:
        local.put(drafter / rel, str(dst / rel))  # temp name + rename, like rsync and SFTP
    proc.write(b"done\n")
    out = json.loads(proc.wait().stdout)
    assert out["aborted"] is False and out["deleted"] == ["old.bin"]
    assert out["files"] == {r: [e.sha256, e.size] for r, e in m.files.items()}

    aborted = local.start([sys.executable, "-c", verify_program(args | {"root": str(tmp_path / "empty")})],
                          timeout=30)
    aborted.close_stdin()  # the copy failed: EOF without "done"
    assert json.loads(aborted.wait().stdout)["aborted"] is True


def test_a_failed_verification_names_the_files(drafter: Path, tmp_path: Path, local: LocalNode,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkserve.deploy import sync as sync_mod
    def bad_copy(node: Node, local_dir: Path, remote_dir: str, rels: list[str], total: int = 0) -> None:
        for rel in rels:
            node.write_bytes(f"{remote_dir}/{rel}", b"not the drafter")

    monkeypatch.setattr(sync_mod, "_sftp_copy", bad_copy)
    with pytest.raises(NodeError, match=r"^head: sync: after copying, 3 file\(s\) still differ"):
        sync_dir(local, drafter, str(tmp_path / "dst"))


def test_on_all_runs_meanwhile_in_the_calling_thread_while_the_items_run() -> None:
    import threading

    from sparkserve.nodes.parallel import after, on_all

    started = threading.Event()
    seen: list[bool] = []

    def work(i: int) -> int:
        started.set()
        time.sleep(0.2)
        return i * 2

    def meanwhile() -> None:
        seen.append(started.wait(5) and threading.current_thread() is threading.main_thread())

    assert on_all([1, 2], work, meanwhile=meanwhile) == {"1": 2, "2": 4} and seen == [True]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(time.sleep, 0.2)
        assert pool.submit(after, first, lambda: first.done()).result() is True


def test_one_run_on_the_node_mirrors_every_model_it_is_asked_for(tmp_path: Path, local: LocalNode,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkserve.deploy.remotemeta import fetch_metas
    from sparkserve.errors import BadInput

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}\n')
    runs: list[list[str]] = []
    real = local.run
    monkeypatch.setattr(local, "run", lambda argv, **kw: runs.append(argv) or real(argv, **kw))
    got = fetch_metas(local, [(str(model), tmp_path / "m1", "model.target"),
                              (str(tmp_path / "nope"), tmp_path / "m2", "drafter.path")])
    assert got[0] == tmp_path / "m1" and (tmp_path / "m1" / "config.json").read_text() == '{"a": 1}\n'
    assert isinstance(got[1], BadInput) and got[1].where == "drafter.path" and len(runs) == 1


def test_the_docker_check_after_connecting_is_the_answer_the_connection_was_opened_with() -> None:
    from sparkserve.nodes.docker_client import NodeDockerClient

    class Api:
        calls = 0

        def version(self, *a: object, **k: object) -> dict[str, str]:
            Api.calls += 1
            return {"Version": "27.0", "ApiVersion": "1.47"}

    client = NodeDockerClient.__new__(NodeDockerClient)
    client.api = Api()  # type: ignore[assignment]
    client._opened_with = {"Version": "26.1", "ApiVersion": "1.45"}
    assert client.version()["Version"] == "26.1" and Api.calls == 0  # once: the connect's own answer
    assert client.version()["Version"] == "27.0" and Api.calls == 1  # then the daemon is asked


def test_a_containers_tty_is_learnt_from_its_inspect_not_asked_before_each_log_read(monkeypatch) -> None:
    import docker

    from sparkserve.nodes.docker_client import NodeAPIClient

    asked: list[str] = []
    monkeypatch.setattr(docker.APIClient, "inspect_container",
                        lambda self, c: asked.append(c) or {"Id": "abc", "Config": {"Tty": False}})
    api = NodeAPIClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    assert api.inspect_container("abc")["Id"] == "abc" and asked == ["abc"]
    assert api._check_is_tty("abc") is False and asked == ["abc"]  # known: no second inspect
    assert api._check_is_tty("other") is False and asked == ["abc", "other"]


def test_nodes_close_all_at_once() -> None:
    from sparkserve.nodes.factory import close_nodes

    class Slow:
        closed = 0

        def close(self) -> None:
            time.sleep(0.3)
            Slow.closed += 1

    t0 = time.monotonic()
    close_nodes({str(i): Slow() for i in range(4)})  # type: ignore[misc]
    assert Slow.closed == 4 and time.monotonic() - t0 < 1.0
