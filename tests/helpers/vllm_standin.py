"""A stand-in for the pinned vLLM base image, built on a rig node from the rig's offline Debian base image.

    whl = vllm_wheel("x86_64")                  # the real vllm==0.33.0 wheel, cached in $SSRIG_CACHE/wheels
    image_id = ensure_standin(client, STANDIN_REF, whl)

The stand-in is ``sparkserve-rig/base:bookworm`` + the host's ``git`` (the applier runs ``git apply``; same
Debian release, so the same libraries) + the real wheel unpacked into ``/usr/local/lib/python3.11/dist-packages``:
every ``vllm/**/*.py`` file, the wheel's ``dist-info`` (``RECORD``, ``METADATA``) and one real kernel library
(``_flashmla_C.abi3.so``, 3.9 MB: its ``.nv_fatbin`` holds sm_90a and sm_100a cubins). The other ``.so`` files
(850 MB) are left out to keep the build seconds long; RECORD then lists them as missing, never as differing.
No torch: ``import vllm`` fails in it, which the smoke-test refusal test uses. Every distribution the wheel's
``Requires-Dist`` names is there as metadata alone (an empty ``<name>-<version>.dist-info``, at a version inside
its specifier: :func:`requirement_stubs`), so the check of vLLM's declared dependencies passes as on a real image.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

RIG_DIR = Path(__file__).resolve().parents[1] / "rig"
if str(RIG_DIR) not in sys.path:
    sys.path.insert(0, str(RIG_DIR))

import rig as riglib  # noqa: E402

VLLM_VERSION = "0.33.0"
STANDIN_REF = "sparkserve-standin/vllm:0.33.0"
STANDIN_HASH_LABEL = "io.sparkserve.test.standin-hash"
SITE = "usr/local/lib/python3.11/dist-packages"
KEEP_SO = "vllm/_flashmla_C.abi3.so"
PLATFORMS = {"x86_64": "manylinux_2_28_x86_64", "aarch64": "manylinux_2_28_aarch64"}


def wheel_dir() -> Path:
    d = riglib.CACHE_DIR / "wheels"
    d.mkdir(parents=True, exist_ok=True)
    return d


def vllm_wheel(arch: str) -> Path:
    """The real ``vllm==0.33.0`` wheel for ``arch`` (x86_64 | aarch64): downloaded once with pip into the
    rig cache (``$SSRIG_CACHE/wheels``, kept by ``scripts/rig down``), reused by every later run."""
    plat = PLATFORMS[arch]
    found = sorted(wheel_dir().glob(f"vllm-{VLLM_VERSION}-*-{plat}.whl"))
    if found:
        return found[0]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheel_dir()), "--platform", plat,
            "--python-version", "3.12", "--only-binary", ":all:", f"vllm=={VLLM_VERSION}"]
    res = subprocess.run(argv, capture_output=True, text=True)
    found = sorted(wheel_dir().glob(f"vllm-{VLLM_VERSION}-*-{plat}.whl"))
    if res.returncode or not found:
        raise RuntimeError(f"pip download of vllm=={VLLM_VERSION} ({plat}) failed: {res.stderr.strip()[-400:]}")
    return found[0]


def unpacked(arch: str, members: str = "all") -> Path:
    """The wheel for ``arch`` unpacked (once) under the cache: ``members="so"`` only its ``.so`` files and
    ``_version.py`` (what the arch census reads), ``"all"`` everything."""
    whl = vllm_wheel(arch)
    out = wheel_dir() / f"unpacked-{arch}-{members}"
    if (out / ".done").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist()
                 if members == "all" or n.endswith(".so") or n.endswith("/_version.py") or n.endswith("/RECORD")]
        z.extractall(out, names)
    (out / ".done").write_text("ok\n")
    return out


def _wanted(name: str) -> bool:
    return (name.startswith("vllm/") and name.endswith(".py")) or name == KEEP_SO or ".dist-info/" in name


def requirement_stubs(metadata: str) -> dict[str, bytes]:
    """``<name>-<version>.dist-info/METADATA`` for every requirement of a wheel's METADATA that no extra gates:
    metadata alone, at the specifier's own version (``==``, ``>=``, ``~=``), else 0."""
    import re

    from packaging.requirements import Requirement

    out: dict[str, bytes] = {}
    for line in re.findall(r"^Requires-Dist:\s*(.+)$", metadata, re.M):
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        version = next((sp.version for sp in req.specifier if sp.operator in ("==", ">=", "~=")), "0")
        name = re.sub(r"[-_.]+", "_", req.name).lower()
        out[f"{name}-{version}.dist-info/METADATA"] = (f"Metadata-Version: 2.1\nName: {req.name}\n"
                                                       f"Version: {version}\n").encode()
    return dict(sorted(out.items()))


def standin_context(whl: Path) -> tuple[bytes, str]:
    """The stand-in's build context (a tar) and its content hash."""
    buf = io.BytesIO()
    h = hashlib.sha256()
    dockerfile = (f"FROM {riglib.BASE_REF}\nCOPY git /usr/bin/git\nCOPY site/ /{SITE}/\n").encode()
    git = Path(shutil.which("git") or "/usr/bin/git").read_bytes()
    with tarfile.open(fileobj=buf, mode="w") as tf, zipfile.ZipFile(whl) as z:
        for name, data, mode in (("Dockerfile", dockerfile, 0o644), ("git", git, 0o755)):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), mode
            tf.addfile(ti, io.BytesIO(data))
            h.update(name.encode() + hashlib.sha256(data).digest())
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if info.is_dir() or not _wanted(info.filename):
                continue
            data = z.read(info)
            ti = tarfile.TarInfo(f"site/{info.filename}")
            ti.size, ti.mode = len(data), 0o644
            tf.addfile(ti, io.BytesIO(data))
            h.update(info.filename.encode() + hashlib.sha256(data).digest())
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for name, data in requirement_stubs(z.read(meta).decode()).items():
            ti = tarfile.TarInfo(f"site/{name}")
            ti.size, ti.mode = len(data), 0o644
            tf.addfile(ti, io.BytesIO(data))
            h.update(name.encode() + hashlib.sha256(data).digest())
    return buf.getvalue(), h.hexdigest()[:16]


def ensure_standin(client, ref: str = STANDIN_REF, whl: Path | None = None) -> str:
    """Build the stand-in on the node ``client`` talks to unless it is there from the same inputs; its ID."""
    whl = whl or vllm_wheel("x86_64")
    ctx, digest = standin_context(whl)
    try:
        img = client.images.get(ref)
        if (img.attrs.get("Config") or {}).get("Labels", {}).get(STANDIN_HASH_LABEL) == digest:
            return str(img.id)
    except Exception:  # noqa: BLE001 (docker.errors.ImageNotFound: not built yet)
        pass
    img, _ = client.images.build(fileobj=io.BytesIO(ctx), custom_context=True, tag=ref, rm=True, forcerm=True,
                                 network_mode="none", labels={STANDIN_HASH_LABEL: digest})
    return str(img.id)


# -- arm64 (built and run under qemu user emulation) ------------------------------------------------------

ARM64_BASE_REF = "sparkserve-standin/base-arm64:bookworm"
ARM64_STANDIN_REF = "sparkserve-standin/vllm-arm64:0.33.0"
#: the arm64 stand-in's vLLM subset: what the series and the checks touch, the registry, the version (the
#: RECORD check then hashes a few hundred files, not 5,800 — seconds under qemu, not minutes)
ARM64_SUBSET = ("vllm/_version.py", "vllm/config/", "vllm/model_executor/models/", "vllm/models/beam/",
                "vllm/v1/core/", "vllm/v1/worker/gpu/spec_decode/eagle/", "vllm/v1/worker/gpu/model_states/")


def ensure_binfmt_aarch64() -> None:
    """Register qemu-aarch64 with binfmt_misc (mounting it first); RuntimeError saying why when it cannot."""
    handler = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if handler.exists() and "enabled" in handler.read_text():
        return
    mnt = Path("/proc/sys/fs/binfmt_misc")
    if not (mnt / "register").exists():
        r = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(mnt)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"cannot mount binfmt_misc: {r.stderr.strip()}")
    r = subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True, text=True)
    if r.returncode or not handler.exists():
        raise RuntimeError(f"cannot enable qemu-aarch64 (qemu-user-static, binfmt-support): {r.stderr.strip()}")


#: debootstrap's bound: on 2 cores the second stage under qemu takes ~6 min; the test's own timeout is 1500 s
DEBOOTSTRAP_TIMEOUT_S = 1200


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (deepest first), from /proc/self/mounts."""
    r = str(root)
    points = [ln.split()[1].replace("\\040", " ") for ln in Path("/proc/self/mounts").read_text().splitlines()]
    return sorted({m for m in points if m == r or m.startswith(r + "/")}, key=len, reverse=True)


def _unmount_under(root: Path) -> None:
    """Detach what debootstrap's second stage mounted in the target (proc, sys, devpts). A run killed mid-way
    leaves them mounted, and then neither ``rmtree`` (it walks into the live /proc and /sys) nor the next
    debootstrap works: CI saw exactly that (a failed "debootstrap arm64" after a proc left mounted)."""
    for m in _mounts_under(root):
        subprocess.run(["umount", "-l", m], capture_output=True)
    left = _mounts_under(root)
    if left:
        raise RuntimeError(f"cannot unmount what a debootstrap left under {root}: {left}")


def _clear(tmp: Path) -> None:
    if tmp.exists():
        _unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def arm64_base_tarball() -> Path:
    """An arm64 Debian bookworm rootfs with python3 and git (debootstrap under qemu; once, cached).

    debootstrap runs in a session of its own; whatever ends it (failure, the bound, the test's timeout, an
    interrupt), its whole process group is killed and every mount it made in the target is detached before
    the half-built tree is removed, so a later run starts clean."""
    import signal

    tar = riglib.CACHE_DIR / "basefs-bookworm-arm64.tar"
    if tar.exists():
        return tar
    ensure_binfmt_aarch64()
    tmp = riglib.CACHE_DIR / "basefs-arm64.tmp"
    _clear(tmp)
    argv = ["debootstrap", "--arch=arm64", "--variant=minbase", "--include=python3,git", "bookworm", str(tmp)]
    out = riglib.CACHE_DIR / "basefs-arm64.debootstrap.out"
    ok = False
    try:
        with out.open("wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            rc: int | None = None
            try:
                rc = proc.wait(timeout=DEBOOTSTRAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                rc = None  # over the bound: reported as a timeout below
            finally:  # the group too: chroot'd dpkg and qemu children outlive a killed debootstrap
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if rc != 0:
            log = tmp / "debootstrap" / "debootstrap.log"
            detail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            why = f"timed out after {DEBOOTSTRAP_TIMEOUT_S} s" if rc is None else f"exit {rc}"
            raise RuntimeError(f"debootstrap arm64 {why}: {out.read_text(errors='replace')[-800:]}\n"
                               f"debootstrap.log: {detail}")
        _unmount_under(tmp)
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for f in (tmp / sub).glob("*"):
                if f.is_file():
                    f.unlink()
        subprocess.run(["tar", "-C", str(tmp), "--numeric-owner", "-cf", f"{tar}.part", "."], check=True)
        Path(f"{tar}.part").replace(tar)
        ok = True
    finally:
        _clear(tmp)
        if not ok:
            Path(f"{tar}.part").unlink(missing_ok=True)
    return tar


def arm64_standin_context(whl: Path) -> bytes:
    """``FROM scratch`` + the arm64 rootfs + the aarch64 wheel's subset (ARM64_SUBSET) and its dist-info."""
    buf = io.BytesIO()
    dockerfile = f"FROM scratch\nADD rootfs.tar /\nCOPY site/ /{SITE}/\nCMD [\"/bin/bash\"]\n".encode()
    with tarfile.open(fileobj=buf, mode="w") as tf, zipfile.ZipFile(whl) as z:
        ti = tarfile.TarInfo("Dockerfile")
        ti.size = len(dockerfile)
        tf.addfile(ti, io.BytesIO(dockerfile))
        tf.add(str(arm64_base_tarball()), arcname="rootfs.tar")
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            n = info.filename
            if info.is_dir() or not (".dist-info/" in n or (n.endswith(".py") and n.startswith(ARM64_SUBSET))
                                     or n == ARM64_SUBSET[0]):
                continue
            data = z.read(info)
            ti = tarfile.TarInfo(f"site/{n}")
            ti.size, ti.mode = len(data), 0o644
            tf.addfile(ti, io.BytesIO(data))
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for name, data in requirement_stubs(z.read(meta).decode()).items():
            ti = tarfile.TarInfo(f"site/{name}")
            ti.size, ti.mode = len(data), 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def ensure_arm64_standin(docker_url: str, ref: str = ARM64_STANDIN_REF) -> str:
    """Build the arm64 stand-in with BuildKit ``--platform linux/arm64`` on the daemon at ``docker_url``
    (the legacy builder cannot build for another platform); its image ID."""
    import json

    ensure_binfmt_aarch64()
    cli = shutil.which("docker", path="/usr/bin") or "/usr/bin/docker"  # Debian's 20.10 CLI carries BuildKit
    ctx = arm64_standin_context(vllm_wheel("aarch64"))
    digest = hashlib.sha256(ctx).hexdigest()[:16]
    inspect = subprocess.run([cli, "-H", docker_url, "image", "inspect", ref], capture_output=True, text=True)
    if inspect.returncode == 0:
        found = json.loads(inspect.stdout)[0]
        if found.get("Architecture") == "arm64" and \
                ((found.get("Config") or {}).get("Labels") or {}).get(STANDIN_HASH_LABEL) == digest:
            return str(found["Id"])
    argv = [cli, "-H", docker_url, "build", "--platform", "linux/arm64", "--network", "host",
            "--label", f"{STANDIN_HASH_LABEL}={digest}", "-t", ref, "-"]
    r = subprocess.run(argv, input=ctx, capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    if r.returncode:
        raise RuntimeError(f"arm64 stand-in build failed: {r.stderr.decode(errors='replace')[-1500:]}")
    out = subprocess.run([cli, "-H", docker_url, "image", "inspect", "-f", "{{.Id}}", ref], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()
