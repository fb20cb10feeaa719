"""supervise's one node program, run for real on this machine (a LocalNode): memory from a meminfo source, new
kernel lines after a cursor, a rank's processes by its marker, and a py-spy dump of each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sparkserve.nodes.local import LocalNode
from sparkserve.operate.nodefacts import host_facts

PYSPY = str(Path(sys.executable).parent / "py-spy")


def test_memory_comes_from_the_named_source_and_kernel_lines_only_after_the_first_look(tmp_path: Path) -> None:
    node = LocalNode("n7")
    (tmp_path / "n7.meminfo").write_text("MemTotal: 1000 kB\nMemFree: 512 kB\nMemAvailable: 900 kB\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("NVRM: Xid (PCI:0000:01:00): 13, an old one from before supervision\n")
    f = host_facts(node, meminfo=str(tmp_path / "{node}.meminfo"), kmsg=str(kmsg))
    assert f.mem.free == 512 * 1024 and f.mem.available == 900 * 1024
    assert f.kernel_lines == [] and f.cursor == kmsg.stat().st_size  # the first look sets the cursor
    with kmsg.open("a") as k:
        k.write("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n")
    f = host_facts(node, meminfo=str(tmp_path / "{node}.meminfo"), kmsg=str(kmsg), cursor=f.cursor)
    assert f.kernel_lines == ["NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."]
    f2 = host_facts(node, meminfo=str(tmp_path / "missing"), kmsg=str(tmp_path / "nokmsg"), cursor=f.cursor)
    assert f2.mem.free is None and "missing" in (f2.mem.error or "") and f2.kernel_lines is None


def test_a_ranks_processes_are_found_by_marker_and_each_python_one_is_dumped_by_py_spy(tmp_path: Path) -> None:
    code = "import time\ndef serving_loop():\n    while True: time.sleep(0.1)\nserving_loop()\n"
    env = {**os.environ, "SPARKSERVE_RANK_ID": "abc-r0"}
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        time.sleep(0.5)
        f = host_facts(LocalNode("n0"), meminfo="/proc/meminfo", kmsg=None,
                       ranks={"rank0": {"marker": "SPARKSERVE_RANK_ID=abc-r0"}}, dump=True,
                       pyspy=["no-such-py-spy", PYSPY])
        assert f.pids["rank0"] == [child.pid]
        assert f.pyspy == PYSPY
        dump = f.dumps[str(child.pid)]
        assert "Thread " in dump and "serving_loop" in dump, dump
        f = host_facts(LocalNode("n0"), meminfo="/proc/meminfo", kmsg=None,
                       ranks={"rank0": {"root_pid": child.pid}}, dump=True, pyspy=["no-such-py-spy"])
        assert f.pids["rank0"] == [child.pid]
        assert "py-spy not found" in f.dumps[str(child.pid)]
    finally:
        child.kill()
        child.wait()


def test_a_torn_nonblocking_dump_is_tried_again_and_last_blocking(tmp_path: Path) -> None:
    """`py-spy dump --nonblocking` reads a running interpreter as it changes, and a read can tear (an incident on
    the rig held only `Error: Failed to get stack traces … Bad address (os error 14)`). A torn read cannot be made
    on demand, so this py-spy tears every nonblocking read (with real py-spy's words) and hands a blocking one to
    real py-spy: the incident still gets the stack."""
    calls = tmp_path / "calls"
    tearing = tmp_path / "py-spy"
    tearing.write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> {calls}\n"
        "case \" $* \" in *' --nonblocking '*)\n"
        "  echo 'Error: Failed to get stack traces'; echo 'Caused by:'; echo '    0: Bad address (os error 14)'\n"
        "  exit 1;;\n"
        "esac\n"
        f"exec {PYSPY} \"$@\"\n")
    tearing.chmod(0o755)
    code = "import time\ndef serving_loop():\n    while True: time.sleep(0.1)\nserving_loop()\n"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "SPARKSERVE_RANK_ID": "abc-r1"})
    try:
        time.sleep(0.5)
        f = host_facts(LocalNode("n0"), meminfo="/proc/meminfo", kmsg=None,
                       ranks={"rank0": {"marker": "SPARKSERVE_RANK_ID=abc-r1"}}, dump=True, pyspy=[str(tearing)])
        dump = f.dumps[str(child.pid)]
        assert "Thread " in dump and "serving_loop" in dump, dump
        tries = calls.read_text().splitlines()
        assert [("--nonblocking" in t) for t in tries] == [True, True, False], tries
    finally:
        child.kill()
        child.wait()
