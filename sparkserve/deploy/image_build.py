"""`sparkserve image build`: the recipe's image, built on a node (the head by default), smoke-tested, tagged.

    files = load_recipe_files(Path("docker/recipe.yaml"))    # BadInput before any node is touched
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
import io
import json
import re
import secrets
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
from platformdirs import user_state_dir

from sparkserve.errors import BadInput, GateFailed, RemoteFailure
from sparkserve.nodes.base import CommandResult, Node, NodeError
from sparkserve.nodes.docker_client import docker_errors
from sparkserve.nodes.images import image_identity
from sparkserve.plan.image_identity import facts_problems
from sparkserve.plan.image_recipe import (
    Lock,
    Recipe,
    build_args,
    image_tag,
    lock_digest,
    lock_json,
    parse_lock,
    parse_recipe,
    series_names,
)

Reporter = Callable[[str], None]
STEP = re.compile(r"^#(\d+) \[(?:(?P<stage>[\w.-]+) )?(?P<n>\d+)/(?P<m>\d+)\] (?P<what>.*)$")
STEP_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
PATCH_MARK = re.compile(r"==> (patch \S+: .*|series: .*)$")
TAIL_LINES = 15


class BuildFailed(RemoteFailure):
    """The image build failed on the node: which stage, its last lines, where the full log is."""


@dataclass
class RecipeFiles:
    """A recipe and the files it names, read on this machine."""

    path: Path
    recipe: Recipe
    lock_path: Path
    lock: Lock | None
    series_text: str
    series: list[tuple[str, bytes]]
    checks: bytes | None


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

    def as_json(self) -> dict[str, object]:
        return {"node": self.node, "tag": self.tag, "image_id": self.image_id, "fingerprint": self.fingerprint,
                "lock_sha256": self.lock_sha256, "seconds": round(self.seconds, 1), "log": str(self.log_path),
                "pushed": self.pushed, "vllm": self.facts.get("vllm"),
                "differing_from_record": (self.facts.get("record") or {}).get("differing")}


def docker_dir() -> Path:
    """``docker/`` of this checkout, or the copy packaged in the wheel (``sparkserve/docker``)."""
    here = Path(__file__).resolve().parents[1]
    for cand in (here.parent / "docker", here / "docker"):
        if (cand / "Dockerfile").is_file():
            return cand
    raise BadInput("docker/", "no Dockerfile next to sparkserve (neither a checkout nor the packaged copy)")


def default_recipe() -> Path:
    return docker_dir() / "recipe.yaml"


def lock_path_for(recipe: Path) -> Path:
    return recipe.with_name(recipe.stem + ".lock.json")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise BadInput(str(path), f"cannot read the {what}: {e.strerror or e}") from None


def load_recipe_files(path: Path) -> RecipeFiles:
    """Read a recipe, its series and patches, its upstream checks and its lock (if there is one)."""
    recipe = parse_recipe(_read(path, "recipe").decode(errors="replace"), str(path))
    series_path = (path.parent / recipe.series).resolve()
    series_text = _read(series_path, "series file").decode(errors="replace")
    series = [(name, _read(series_path.parent / name, "patch")) for name in series_names(series_text)]
    checks = _read((path.parent / recipe.upstream_checks).resolve(), "upstream checks") \
        if recipe.upstream_checks else None
    lock_path = lock_path_for(path)
    lock = parse_lock(lock_path.read_text(), str(lock_path)) if lock_path.is_file() else None
    return RecipeFiles(path, recipe, lock_path, lock, series_text, series, checks)


# ----------------------------------------------------------------------------------------- build context


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def context_files(files: RecipeFiles, lock: Lock | None) -> dict[str, bytes]:
    d = docker_dir()
    out = {
        "Dockerfile": (d / "Dockerfile").read_bytes(),
        "tools/apply_series.py": (d / "tools" / "apply_series.py").read_bytes(),
        "tools/image_facts.py": (d / "tools" / "image_facts.py").read_bytes(),
        "series/series": files.series_text.encode(),
        "upstream-checks.json": files.checks if files.checks is not None else b"[]\n",
        "lock.json": lock_json(lock).encode() if lock is not None else b"{}\n",
    }
    out |= {f"series/{name}": data for name, data in files.series}
    return out


def build_context(files: RecipeFiles, lock: Lock) -> bytes:
    """The build context tar: Dockerfile, tools/, series/, upstream-checks.json, lock.json."""
    return _tar(context_files(files, lock))


def facts_program() -> str:
    return (docker_dir() / "tools" / "image_facts.py").read_text()


# ------------------------------------------------------------------------------------------- in an image


def run_in_image(node: Node, image: str, argv: list[str], *, files: dict[str, bytes] | None = None,
                 step: str = "image", timeout: float = 600.0) -> tuple[int, str, str]:
    """Run ``argv`` (entrypoint overridden) in a throwaway container of ``image`` with no network; ``files``
    are put under ``/ctx`` first. (exit code, stdout, stderr); the container is always removed."""
    with docker_errors(node, step, image):
        client = node.docker()
        ctr = client.containers.create(image, command=argv[1:], entrypoint=[argv[0]], network_mode="none",
                                       labels={"io.sparkserve.scratch": "1"})
        try:
            if files:
                ctr.put_archive("/", _tar({f"ctx/{k}": v for k, v in files.items()}))
            ctr.start()
            rc = int(ctr.wait(timeout=timeout).get("StatusCode", 1))
            out = ctr.logs(stdout=True, stderr=False).decode(errors="replace")
            err = ctr.logs(stdout=False, stderr=True).decode(errors="replace")
        finally:
            with contextlib.suppress(docker.errors.APIError):
                ctr.remove(force=True)
    return rc, out, err


def image_facts(node: Node, image: str, *, archs: bool = False) -> dict:
    """The facts program's JSON for ``image`` on ``node`` (run with the image's own python3)."""
    argv = ["python3", "-c", facts_program()] + ([] if archs else ["--no-archs"])
    rc, out, err = run_in_image(node, image, argv, step="image facts")
    if rc != 0:
        raise NodeError(node.name, "image facts", f"the facts program failed in {image} (exit {rc})",
                        last_lines=err.strip().splitlines()[-10:])
    return dict(json.loads(out))


# -------------------------------------------------------------------------------------------------- lock


def write_lock(files: RecipeFiles, lock: Lock) -> None:
    files.lock_path.write_text(lock_json(lock))
    files.lock = lock


# ------------------------------------------------------------------------------------------------- build


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
                say: Reporter | None = None, timeout: float = 6 * 3600.0) -> BuildResult:
    """Build the recipe's image on ``node`` (rules in the module docstring)."""
    say = say or (lambda _s: None)
    recipe = files.recipe
    lane = lane or recipe.lane
    if lane != recipe.lane:
        recipe = recipe.model_copy(update={"lane": lane})
    if lock.lane != lane:
        raise BadInput("--lane", f"the lock is for the {lock.lane} lane; re-lock for {lane}")
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
        proc.write(build_context(files, lock))
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
    except (GateFailed, NodeError):
        with docker_errors(node, "build", f"untag {tag}"):
            node.docker().images.remove(tag, noprune=False)
        say(f"smoke test failed: removed the tag {tag}")
        raise
    pushed = None
    if push:
        pushed = push_image(node, tag, push, say=say)
    return BuildResult(node.name, tag, found[0], found[1], lock_digest(lock), time.monotonic() - t0, log_path,
                       facts, pushed)


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
    (:func:`~sparkserve.plan.image_identity.facts_problems`). GateFailed naming the first problem."""
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
