"""`sparkserve image build`: the recipe's image, built on a node (the head by default), smoke-tested, tagged.

    files = load_recipe_files(Path("docker/recipe.yaml"))    # (image.context) BadInput before any node
    lock = require_lock(files)     # (image_relock) BadInput: no lock / it disagrees (unless relock)
    lock = relock(node, files)     # (image_relock) resolve the pins there, digest the series
    result = build_image(node, files, lock, say=say)         # BuildResult; BuildFailed names stage + lines

The build runs the docker CLI on the node: ``docker buildx build --load`` where buildx is installed, else
``DOCKER_BUILDKIT=1 docker build`` with a docker CLI old enough (< 23) to carry BuildKit itself. The
context (``docker/Dockerfile``, ``docker/tools``, the recipe's series, its upstream checks and the lock;
tens of KB) goes to the build's stdin as a tar, so the node needs no checkout. The full log is written on
the node and copied back here; phases (``[stage n/m]`` steps, ``==> patch`` lines) are reported as they
appear. The image is tagged ``<recipe name>:<lock sha256[:12]>``, then smoke-tested by running it
(``import <smoke_import>``; the facts program: vLLM version/commit, files differing from the wheel's
RECORD = the series' files, DFlash2 classes); a failed smoke test removes the tag.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from platformdirs import user_state_dir

from sparkserve.errors import BadInput, GateFailed, RemoteFailure
from sparkserve.image.context import RecipeFiles, build_context, overlay_bytes
from sparkserve.image.gpu_smoke import GpuSmoke
from sparkserve.image.identity import facts_problems
from sparkserve.image.on_nodes import image_identity
from sparkserve.image.recipe import Lock, Recipe, build_args, image_tag, lock_digest
from sparkserve.image.run import image_facts, run_in_image
from sparkserve.nodes.base import CommandResult, Node, NodeError
from sparkserve.nodes.docker_client import docker_errors

Reporter = Callable[[str], None]
STEP = re.compile(r"^#(\d+) \[(?:(?P<stage>[\w.-]+) )?(?P<n>\d+)/(?P<m>\d+)\] (?P<what>.*)$")
STEP_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
PATCH_MARK = re.compile(r"==> (patch \S+: .*|series: .*)$")
TAIL_LINES = 15


class BuildFailed(RemoteFailure):
    """The image build failed on the node: which stage, its last lines, where the full log is."""


@dataclass
class BuildResult:
    node: str
    tag: str
    image_id: str
    fingerprint: str
    lock_sha256: str
    seconds: float
    log_path: Path
    facts: dict = field(default_factory=dict)
    pushed: str | None = None
    gpu: dict | None = None

    def as_json(self) -> dict[str, object]:
        return {"node": self.node, "tag": self.tag, "image_id": self.image_id, "fingerprint": self.fingerprint,
                "lock_sha256": self.lock_sha256, "seconds": round(self.seconds, 1), "log": str(self.log_path),
                "pushed": self.pushed, "vllm": self.facts.get("vllm"),
                "differing_from_record": (self.facts.get("record") or {}).get("differing"),
                "gpu_smoke": self.gpu, "gpu_verified": bool(self.gpu and self.gpu.get("ok"))}


def builder_argv(node: Node) -> list[str]:
    """How to run a BuildKit build on ``node``: buildx, else an old docker CLI with DOCKER_BUILDKIT=1.

    NodeError when neither is there (docker >= 23 dropped the built-in BuildKit client: install buildx)."""
    if node.run(["docker", "buildx", "version"], timeout=30, check=False, step="build").ok:
        return ["docker", "buildx", "build", "--load"]
    for cli in ("docker", "/usr/bin/docker"):
        res = node.run([cli, "version", "--format", "{{.Client.Version}}"], timeout=30, check=False, step="build")
        m = re.match(r"(\d+)\.", res.stdout.strip())
        if res.ok and m and int(m.group(1)) < 23:
            return ["env", "DOCKER_BUILDKIT=1", cli, "build"]
    raise NodeError(node.name, "build", "no BuildKit builder: `docker buildx` is not installed and the docker "
                    "CLI is >= 23 (it needs buildx for BuildKit); install the docker-buildx plugin")


def _check_local_pins(node: Node, lane: str, recipe: Recipe, lock: Lock) -> None:
    """A FROM image that was never pushed is pinned by its local image ID: it must still be that image here."""
    src = lock.source or {}
    pins = [(recipe.base.image, lock.base.id)] if lane == "overlay" and lock.base.digest_ref is None else []
    if lane == "source":
        pins = [(str(src.get(f"{k}_image")), src.get(f"{k}_id")) for k in ("cuda_devel", "cuda_runtime")
                if src.get(f"{k}_id")]
    for image, want in pins:
        found = image_identity(node, image)
        if found is None or found[0] != want:
            raise NodeError(node.name, "build", f"the base {image} is {found[0][:19] if found else 'missing'} "
                            f"on this node but the lock pins {str(want)[:19]} (never pushed, so only its ID "
                            "pins it); re-lock")


def _check_platform(node: Node, platform: str | None, probe_image: str | None = None) -> None:
    """A --platform other than the node's own needs qemu user emulation there (a binfmt_misc handler); fail
    loudly without it. The handler is read from /proc/sys/fs/binfmt_misc, or — where binfmt_misc is not
    mounted in the node's view but registered in the kernel — proven by running ``true`` in ``probe_image``."""
    if not platform:
        return
    arch = platform.split("/", 1)[-1].split("/")[0]
    machine = node.run(["uname", "-m"], timeout=20, step="build").stdout.strip()
    native = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    if arch == native:
        return
    qemu = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}.get(arch, f"qemu-{arch}")
    res = node.run(["cat", f"/proc/sys/fs/binfmt_misc/{qemu}"], timeout=20, check=False, step="build")
    if res.ok and "enabled" in res.stdout:
        return
    if probe_image is not None:
        try:
            rc, _out, _err = run_in_image(node, probe_image, ["true"], step="build", timeout=120)
        except NodeError:
            rc = 1
        if rc == 0:
            return
    raise NodeError(node.name, "build", f"--platform {platform} on a {machine} node needs qemu user "
                    f"emulation: /proc/sys/fs/binfmt_misc/{qemu} is not registered (mount binfmt_misc and "
                    "`update-binfmts --enable " + qemu + "`, or build on an arm64 node)")


def _state_dir() -> Path:
    d = Path(user_state_dir("sparkserve")) / "builds"
    try:
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError:
        import tempfile

        return Path(tempfile.gettempdir())


def failing_step(log: str) -> tuple[str, list[str]]:
    """From a BuildKit ``--progress=plain`` log: the step that failed (``[stage n/m] …``) and its last lines."""
    lines = log.splitlines()
    steps: dict[str, str] = {}
    output: dict[str, list[str]] = {}
    failed: str | None = None
    for line in lines:
        m = STEP.match(line)
        if m:
            steps[m.group(1)] = f"[{m.group('stage') or 'build'} {m.group('n')}/{m.group('m')}] {m.group('what')}"
            continue
        e = STEP_ERROR.match(line)
        if e:
            failed = failed or e.group(1)
            output.setdefault(e.group(1), []).append(line)
            continue
        num = line[1:].split(" ", 1)[0] if line.startswith("#") else None
        if num and num.isdigit():
            output.setdefault(num, []).append(line.split(" ", 2)[-1] if line.count(" ") >= 2 else line)
    if failed is None:
        tail = [x for x in lines if x.strip()][-TAIL_LINES:]
        return "build", tail
    return steps.get(failed, f"step #{failed}")[:160], output.get(failed, [])[-TAIL_LINES:]


def build_image(node: Node, files: RecipeFiles, lock: Lock, *, lane: str | None = None, push: str | None = None,
                platform: str | None = None, log_path: Path | None = None, smoke_import: str | None = "vllm",
                say: Reporter | None = None, timeout: float = 6 * 3600.0, overlays: dict[str, bytes] | None = None,
                gpu_capability: str = "12.1") -> BuildResult:
    """Build the recipe's image on ``node`` (rules in the module docstring)."""
    say = say or (lambda _s: None)
    recipe = files.recipe
    lane = lane or recipe.lane
    if lane != recipe.lane:
        recipe = recipe.model_copy(update={"lane": lane})
    if lock.lane != lane:
        raise BadInput("--lane", f"the lock is for the {lock.lane} lane; re-lock for {lane}")
    if lane == "prebuilt":
        raise BadInput("--lane", "a prebuilt image is not built: image build runs use_prebuilt for it")
    if lane == "source":
        check_source_node(node, platform)
    overlays = overlay_bytes(files) if overlays is None else overlays
    tag = image_tag(recipe, lock)
    args = build_args(recipe, lock)
    _check_local_pins(node, lane, recipe, lock)
    _check_platform(node, platform, probe_image=(lock.base.id or lock.base.digest_ref) if lane == "overlay" else None)
    argv = builder_argv(node) + ["--progress=plain", "--network=host", "--target", lane, "-t", tag]
    if platform:
        argv += ["--platform", platform]
    for k, v in sorted(args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    argv += ["-f", "Dockerfile", "-"]
    job = f"/tmp/sparkserve-build-{secrets.token_hex(6)}"
    stem = f"{recipe.name.replace('/', '_')}-{lock_digest(lock)[:12]}-{int(time.time())}"
    log_path = log_path or _state_dir() / f"{stem}.log"
    node.makedirs(job)
    remote_log = f"{job}/build.log"
    say(f"building {tag} on {node.name} ({' '.join(argv[:2])} … --target {lane})")
    t0 = time.monotonic()
    proc = node.start(["sh", "-c", 'log="$1"; shift; exec "$@" >"$log" 2>&1', "sh", remote_log, *argv],
                      timeout=timeout, step="build")
    res: list[CommandResult] = []
    try:
        proc.write(build_context(files, lock, overlays))
        proc.close_stdin()
        waiter = threading.Thread(target=lambda: res.append(proc.wait(check=False)), daemon=True)
        waiter.start()
        seen = 0
        while waiter.is_alive():
            waiter.join(1.0)
            seen = _report_phases(node, remote_log, seen, say)
        _report_phases(node, remote_log, seen, say)
        text = _fetch_log(node, remote_log)
        log_path.write_text(text)
    finally:
        with contextlib.suppress(NodeError):
            node.run(["rm", "-rf", "--", job], timeout=30, check=False, step="build")
    if not res or not res[0].ok:
        stage, tail = failing_step(text)
        raise BuildFailed(f"{node.name}: build", f"{stage} failed (full log: {log_path})", node=node.name,
                          step="build", details=tail)
    found = image_identity(node, tag)
    if found is None:
        raise BuildFailed(f"{node.name}: build", f"the build finished but {tag} is not on the node (log: {log_path})",
                          node=node.name, step="build")
    say(f"built {tag} ({found[0][:19]}) in {time.monotonic() - t0:.1f}s; smoke test")
    try:
        facts = smoke_test(node, tag, lock, smoke_import=smoke_import)
        gpu = gpu_stage(node, tag, want_capability=gpu_capability, say=say)
    except (GateFailed, NodeError):
        untag(node, tag)
        say(f"smoke test failed: removed the tag {tag}")
        raise
    if gpu.ok:
        found = image_identity(node, tag) or found
    pushed = None
    if push:
        pushed = push_image(node, tag, push, say=say)
    return BuildResult(node.name, tag, found[0], found[1], lock_digest(lock), time.monotonic() - t0, log_path,
                       facts, pushed, gpu.as_json())


def untag(node: Node, tag: str) -> None:
    with docker_errors(node, "build", f"untag {tag}"):
        node.docker().images.remove(tag, noprune=False)


def gpu_stage(node: Node, tag: str, *, want_capability: str, say: Reporter, mark: bool = True) -> GpuSmoke:
    """The GPU smoke stage (:mod:`sparkserve.image.gpu_smoke`): GateFailed when it ran and a check failed;
    without a GPU it says so loudly and leaves the image marked "not GPU-verified"; a pass is committed into
    the image (``mark``)."""
    from sparkserve.image.gpu_smoke import gpu_smoke, mark_gpu_verified

    say(f"GPU smoke stage on {node.name}: docker run --gpus all {tag} gpu_smoke.py")
    gpu = gpu_smoke(node, tag, want_capability=want_capability)
    if not gpu.ran and not gpu.report:
        say(f"WARNING: {gpu.why}: the GPU smoke stage did NOT run; {tag} is NOT GPU-verified (its facts say so)")
        return gpu
    if not gpu.ok:
        raise GateFailed(f"{node.name}: GPU smoke", f"{tag}: {gpu.why}",
                         details=[f"{r['check']}: {r['detail']}" for r in gpu.report.get("checks", [])])
    if mark:
        mark_gpu_verified(node, tag, gpu)
    say(f"GPU smoke passed on {node.name} (capability {gpu.report.get('capability')}): {tag} is GPU-verified")
    return gpu


def check_source_node(node: Node, platform: str | None) -> None:
    """The source lane compiles vLLM's CUDA kernels for SM12x natively: only on an aarch64 node (a DGX Spark),
    never cross-built or under qemu (hours of nvcc under emulation, and no GPU to smoke-test the result).
    NodeError saying why otherwise."""
    machine = node.run(["uname", "-m"], timeout=20, step="build").stdout.strip()
    if machine != "aarch64" or (platform and platform != "linux/arm64"):
        raise NodeError(node.name, "build", f"the source lane builds only natively on an aarch64 SM12x node (a DGX "
                        f"Spark); {node.name} is {machine}" + (f" and --platform is {platform}" if platform else "")
                        + ": its kernels, FlashInfer wheels and GPU smoke stage cannot be made right here")


def _report_phases(node: Node, remote_log: str, seen: int, say: Reporter) -> int:
    try:
        text = node.read_text(remote_log)
    except (NodeError, OSError):
        return seen
    lines = text.splitlines()
    for line in lines[seen:]:
        m = STEP.match(line)
        if m and not m.group("what").startswith(("[internal]", "load ")):
            say(f"stage {m.group('stage') or 'build'} {m.group('n')}/{m.group('m')}: {m.group('what')[:100]}")
        p = PATCH_MARK.search(line)
        if p:
            say(p.group(1))
    return len(lines)


def _fetch_log(node: Node, remote_log: str) -> str:
    try:
        return node.read_text(remote_log)
    except (NodeError, OSError) as e:
        return f"(the build log could not be read back: {e})\n"


def smoke_test(node: Node, tag: str, lock: Lock, *, smoke_import: str | None = "vllm") -> dict:
    """Run the built image: ``import <smoke_import>`` works, and its facts are its lock's
    (:func:`~sparkserve.image.identity.facts_problems`). GateFailed naming the first problem."""
    if smoke_import:
        rc, _out, err = run_in_image(node, tag, ["python3", "-c", f"import {smoke_import}"], step="smoke test")
        if rc != 0:
            last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
            raise GateFailed(f"{node.name}: smoke test", f"`import {smoke_import}` fails in {tag}: {last}")
    facts = image_facts(node, tag)
    problems = facts_problems(facts, lock.model_dump(mode="json"))
    if facts.get("lock") is not None and lock_digest(Lock.model_validate(facts["lock"])) != lock_digest(lock):
        problems.append("the lock inside the image is not the lock it was built from")
    if problems:
        raise GateFailed(f"{node.name}: smoke test", f"{tag}: {problems[0]}", details=problems[1:])
    return facts


def push_image(node: Node, tag: str, ref: str, *, say: Reporter) -> str:
    """Tag ``tag`` as ``ref`` and push it from ``node``; the pushed ``repo@sha256:…``."""
    res = node.run(["docker", "tag", tag, ref], timeout=60, step="push")
    res = node.run(["docker", "push", ref], timeout=3600, step="push", check=False)
    if not res.ok:
        raise NodeError(node.name, "push", f"docker push {ref} failed", last_lines=res.tail())
    m = re.search(r"digest: (sha256:[0-9a-f]{64})", res.stdout)
    pushed = f"{ref.rsplit(':', 1)[0] if ':' in ref.rsplit('/', 1)[-1] else ref}@{m.group(1)}" if m else ref
    say(f"pushed {pushed}")
    return pushed
