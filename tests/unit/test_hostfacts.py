"""GB10 host facts, run for real: the node probe on a LocalNode over a fake procfs (tests/rig/rig.py's own
write_fake_proc), fake `sudo`, `nvidia-smi`, `journalctl` and `dmesg` executables on PATH, and the watchdog's look
against files that change under it. Nothing here writes to the real /proc."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from sparkserve.config import load_config
from sparkserve.deploy.probe import probe_node
from sparkserve.deploy.watchdog import Phase, watchdog_floors
from sparkserve.nodes import LocalNode
from sparkserve.nodes.hostfacts import (
    HostFacts,
    high_order_free,
    host_question,
    host_verdicts,
    kernel_faults,
    memory_verdict,
    sudoers_line,
)
from sparkserve.nodes.hostfacts_node import _node_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rig"))
import rig as riglib  # noqa: E402

GiB = 2**30


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    node = riglib.NodeInfo(name="n1", index=0, host="127.0.0.1", port=22, fabric_ip="127.0.0.1",
                           dir=str(tmp_path), srv_dir=str(tmp_path / "srv"), docker_socket="", gid_index=3)
    return riglib.write_fake_proc(node)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH dir with a fake `sudo` that logs its argv and stdin and then runs the command (as tee would)."""
    d = tmp_path / "bin"
    d.mkdir()
    log = tmp_path / "sudo.log"
    _exe(d / "sudo", f'echo "$*" >> {log}\nif [ "$2" = "-l" ]; then exit 0; fi\nshift\nexec "$@"\n')
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    return d


def cfg_for(proc: Path, **host: object):
    return load_config(overrides={"host": {"proc_root": str(proc), "kernel_log": str(proc / "kmsg"),
                                           "nvidia_smi": "no-such-nvidia-smi", **host},
                                  "serve": {"gpu_memory_utilization": 0.795}})


# -- the probe's host answer, and memory against GMU -----------------------------------------------------------


def test_up_drops_the_page_cache_through_sudo_tee_on_exactly_the_two_vm_files(proc: Path, bin_dir: Path) -> None:
    cfg = cfg_for(proc)
    facts = probe_node(LocalNode("n1"), host=host_question(cfg, drop=True))
    host = HostFacts.from_answer(facts.host or {})
    assert host.drop == ""
    log = (bin_dir.parent / "sudo.log").read_text().splitlines()
    assert log == [f"-n /usr/bin/tee {proc}/sys/vm/drop_caches", f"-n /usr/bin/tee {proc}/sys/vm/compact_memory"]
    assert (proc / "sys/vm/drop_caches").read_text() == "3" and (proc / "sys/vm/compact_memory").read_text() == "1"
    # and that is exactly what the sudoers line `doctor` prints allows
    line = sudoers_line("ubuntu", str(proc))
    assert line == (f"ubuntu ALL=(root) NOPASSWD: /usr/bin/tee {proc}/sys/vm/drop_caches, "
                    f"/usr/bin/tee {proc}/sys/vm/compact_memory")


def test_a_refused_sudo_is_reported_and_memory_is_still_read(proc: Path, bin_dir: Path) -> None:
    _exe(bin_dir / "sudo", 'echo "sudo: a password is required" >&2\nexit 1\n')
    cfg = cfg_for(proc)
    host = HostFacts.from_answer(probe_node(LocalNode("n1"), host=host_question(cfg, drop=True)).host or {})
    assert host.drop and "a password is required" in host.drop
    assert (proc / "sys/vm/drop_caches").read_text() == ""
    assert host.memory([0]) is not None and host.memory([0]).free == int(110.0 * 2**30)  # type: ignore[union-attr]


def test_memfree_not_memavailable_decides_and_the_headline_names_free_memory_against_gmu(proc: Path,
                                                                                         bin_dir: Path) -> None:
    (proc / "meminfo").write_text(riglib.fake_meminfo(total_gib=119.7, free_gib=20.0, available_gib=115.0))
    cfg = cfg_for(proc)
    host = HostFacts.from_answer(probe_node(LocalNode("n1"), host=host_question(cfg, drop=True)).host or {})
    [(name, status, detail)] = memory_verdict(cfg, cfg.nodes[0], host, dropped=True)
    assert (name, status) == ("memory", "fail")
    assert detail.startswith("free unified memory 20.00 GiB is below gpu_memory_utilization 0.795 x 119.70 GiB "
                             "= 95.16 GiB"), detail
    # doctor (no drop yet): the same numbers only warn when the page cache holds the rest and the rule works
    host.sudo = ""
    [(_, status, detail)] = memory_verdict(cfg, cfg.nodes[0], host, dropped=False)
    assert status == "warn" and "`up` drops it" in detail
    host.sudo = "sudo: a password is required"
    [(_, status, detail)] = memory_verdict(cfg, cfg.nodes[0], host, dropped=False)
    assert status == "fail" and sudoers_line(cfg.nodes[0].user) in detail


def test_a_discrete_gpu_is_judged_on_the_drivers_free_memory(proc: Path, bin_dir: Path, tmp_path: Path) -> None:
    smi = _exe(bin_dir / "fake-smi", 'echo "2048, 143771"\necho "140000, 143771"\n')
    cfg = cfg_for(proc, nvidia_smi=str(smi))
    host = HostFacts.from_answer(probe_node(LocalNode("n1"), host=host_question(cfg, drop=False)).host or {})
    mem = host.memory([0])
    assert mem is not None and not mem.unified and (mem.free, mem.total) == (2048 * 2**20, 143771 * 2**20)
    [(_, status, detail)] = memory_verdict(cfg, cfg.nodes[0], host, dropped=True)
    assert status == "fail" and detail.startswith("free GPU memory 2.00 GiB is below gpu_memory_utilization 0.795")
    assert host.memory([1]).free == 140000 * 2**20  # type: ignore[union-attr]  # CUDA_VISIBLE_DEVICES=1
    # GB10: nvidia-smi has no memory of its own to report -> unified memory, MemFree
    _exe(smi, 'echo "[N/A], [N/A]"\n')
    host = HostFacts.from_answer(probe_node(LocalNode("n1"), host=host_question(cfg, drop=False)).host or {})
    assert host.memory([0]).unified  # type: ignore[union-attr]


def test_an_absurd_kv_cache_size_is_named_against_the_whole_memory(proc: Path) -> None:
    cfg = load_config(overrides={"serve": {"kv_cache_memory_bytes": "1000TiB"}})
    host = HostFacts(meminfo=riglib.fake_meminfo())
    verdicts = memory_verdict(cfg, cfg.nodes[0], host, dropped=True)
    assert verdicts[0][0:2] == ("kv_cache", "fail") and "1000.00 TiB" in verdicts[0][2]


def test_high_order_free_counts_blocks_of_order_9_and_up() -> None:
    text = ("Node 0, zone   Normal      1      1      1      1      1      1      1      1      1      3      2\n"
            "Node 0, zone  Movable      0      0      0      0      0      0      0      0      0      0      1\n")
    assert high_order_free(text, 4096) == (3 * 512 + 2 * 1024 + 1 * 1024) * 4096
    assert high_order_free("", 4096) is None


# -- host checks -----------------------------------------------------------------------------------------------


def test_host_checks_each_with_its_fix(proc: Path, bin_dir: Path) -> None:
    cfg = cfg_for(proc)
    (proc / "sys/kernel/osrelease").write_text("7.0.0-1019-nvidia\n")
    (proc / "cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz root=/dev/nvme0n1p2 ro quiet\n")
    (proc / "sys/vm/swappiness").write_text("60\n")
    (proc / "4242").mkdir()
    (proc / "4242/comm").write_text("earlyoom\n")
    a = HostFacts.from_answer(probe_node(LocalNode("a"), host=host_question(cfg, drop=False, sudo_check=True)).host
                              or {})
    a.fw = {"rocep1s0f1": "28.45.1200"}
    b = HostFacts(osrelease="6.11.0-1016-nvidia", driver="580.95.05", fw={"rocep1s0f1": "28.39.1002"},
                  cmdline="iommu.passthrough=1", swappiness="1")
    got = {(node, name): (status, detail) for node, (name, status, detail)
           in host_verdicts(cfg, {"a": a, "b": b}, multi_node=True)}
    assert got["a", "kernel"][0] == "fail" and "grub-reboot" in got["a", "kernel"][1]
    assert got["a", "iommu"][0] == "warn" and "iommu.passthrough=1" in got["a", "iommu"][1]
    assert got["b", "iommu"][0] == "ok"
    assert got["a", "swappiness"][0] == "warn" and "vm.swappiness=1" in got["a", "swappiness"][1]
    assert got["a", "earlyoom"][0] == "warn" and "systemctl disable" in got["a", "earlyoom"][1]
    assert got["a", "page cache drop"] == ("ok", "sudo -n may drop the page cache and compact")
    assert got["a", "kernel parity"][0] == "warn" and "b: 6.11.0-1016-nvidia" in got["a", "kernel parity"][1]
    assert got["a", "firmware parity"][0] == "warn"
    assert a.driver == "580.95.05" and "driver parity" not in {k[1] for k in got}
    # one node: no RDMA, so neither the RDMA kernel nor iommu matter
    one = {name for _, (name, _, _) in host_verdicts(cfg, {"a": a}, multi_node=False)}
    assert "iommu" not in one and "kernel parity" not in one


# -- kernel lines --------------------------------------------------------------------------------------------


def test_kernel_lines_since_the_boot_began_from_a_kmsg_file(proc: Path) -> None:
    cfg = cfg_for(proc)
    with (proc / "kmsg").open("a") as f:
        f.write(riglib.kmsg_record(3, riglib.FAKE_UPTIME_S - 50, "NVRM: Xid (PCI:0000:01:00): 13, old boot"))
        f.write(riglib.kmsg_record(4, riglib.FAKE_UPTIME_S + 5, "NVRM: Xid (PCI:000f:01:00): 31, pid=77, "
                                   "name=python3, MMU Fault"))
        f.write(riglib.kmsg_record(5, riglib.FAKE_UPTIME_S + 6, "usb 1-1: new device"))
    got = kernel_faults(LocalNode("n1"), cfg, since=time.time() - 10)
    assert got.error is None and got.source == str(proc / "kmsg")
    assert got.lines == ["NVRM: Xid (PCI:000f:01:00): 31, pid=77, name=python3, MMU Fault"]


@pytest.mark.parametrize("tool", ["journalctl", "dmesg"])
def test_kernel_lines_from_journalctl_or_dmesg_when_kmsg_is_not_readable(proc: Path, bin_dir: Path,
                                                                        tool: str) -> None:
    now = time.time()
    if tool == "journalctl":
        _exe(bin_dir / "journalctl", f'echo "{now - 3:.6f} spark-a kernel: NVRM: _memdescAllocInternal: '
                                     f'NV_ERR_NO_MEMORY"\necho "{now - 2:.6f} spark-a kernel: eth0: link up"\n')
    else:
        _exe(bin_dir / "dmesg", f'echo "[{riglib.FAKE_UPTIME_S - 3:.6f}] NVRM: Xid (PCI:000f:01:00): 43"\n'
                                f'echo "[{riglib.FAKE_UPTIME_S - 9000:.6f}] NVRM: Xid (PCI:000f:01:00): 13"\n')
    got = _node_kernel({"since": now - 60, "proc_root": str(proc), "source": tool})
    assert got["source"] == tool
    assert [t for _, t in got["lines"]] == (["NVRM: _memdescAllocInternal: NV_ERR_NO_MEMORY"] if tool == "journalctl"
                                            else ["NVRM: Xid (PCI:000f:01:00): 43"])


def test_no_readable_kernel_log_is_said_not_raised(proc: Path) -> None:
    got = _node_kernel({"since": 0, "proc_root": str(proc), "source": str(proc / "no-such-kmsg")})
    assert got["lines"] == [] and "No such file" in got["error"]


# -- the watchdog's look ---------------------------------------------------------------------------------------


def test_watchdog_drops_under_the_soft_floor_and_stops_under_the_hard_floor(proc: Path, bin_dir: Path) -> None:
    cfg = load_config(overrides={"host": {"proc_root": str(proc)},
                                 "watchdog": {"memory_floor_bytes": "8GiB", "soft_floor_bytes": "12GiB",
                                              "drop_interval_s": 0}})
    floors = watchdog_floors(cfg, {})
    node = LocalNode("spark-a")
    # MemFree 10 GiB (MemAvailable 115): soft floor crossed -> a drop, no breach
    (proc / "meminfo").write_text(riglib.fake_meminfo(free_gib=10, available_gib=115))
    free, breach = floors.look("spark-a", node, Phase.LOAD)
    assert breach is None and free == 10 * GiB and floors.drops["spark-a"] == 1
    assert (proc / "sys/vm/drop_caches").read_text() == "3"
    # fragmented: plenty free, but no 2 MiB blocks -> compact
    (proc / "meminfo").write_text(riglib.fake_meminfo(free_gib=50, available_gib=115))
    (proc / "buddyinfo").write_text(riglib.fake_buddyinfo(order10_blocks=0))
    free, breach = floors.look("spark-a", node, Phase.PROFILE)
    assert breach is None and floors.drops["spark-a"] == 2
    # MemFree 6 GiB stays there after the drop: every rank is stopped, the message says why
    (proc / "meminfo").write_text(riglib.fake_meminfo(free_gib=6, available_gib=115))
    free, breach = floors.look("spark-a", node, Phase.PROFILE)
    assert breach is not None and breach.phase == Phase.PROFILE
    msg = breach.message()
    assert "fell to 6.00 GiB" in msg and "after 3 page-cache drop(s)" in msg and "below the floor of 8.00 GiB" in msg


def test_a_discrete_gpu_host_is_watched_on_memavailable(proc: Path) -> None:
    cfg = load_config(overrides={"host": {"proc_root": str(proc)}})
    smi = HostFacts(gpu={"rc": 0, "out": "140000, 143771\n"}, meminfo=riglib.fake_meminfo())
    floors = watchdog_floors(cfg, {"spark-a": smi})
    (proc / "meminfo").write_text(riglib.fake_meminfo(free_gib=1, available_gib=100))
    free, breach = floors.look("spark-a", LocalNode("spark-a"), Phase.LOAD)
    assert breach is None and free == 100 * GiB and not floors.drops
    assert json.dumps(smi.fingerprint())  # the journal's host fingerprint is plain JSON
