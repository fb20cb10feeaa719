"""The GPU smoke stage of `image build`: the built image run with every GPU of the build node.

    smoke = gpu_smoke(node, tag)             # GpuSmoke: ran / ok / the program's report / why not
    new_id = mark_gpu_verified(node, tag, smoke)   # the tag now carries its proof (one small layer)

The checks are ``docker/tools/gpu_smoke.py`` (compute capability, ``import vllm._C, vllm._moe_C,
flashinfer``, nvcc, one FlashInfer JIT kernel and one Triton kernel built and run, the fatbin census of
``_C``/``_moe_C``), run in a throwaway container (``--gpus all``, no network) with the image's own python.
Every image sparkserve builds says ``{"verified": false}`` in ``/opt/sparkserve/gpu-smoke.json`` from its
build on; a passing stage commits one layer on top with the report and ``"verified": true`` (and the label
``io.sparkserve.gpu-verified=true``) under the same tag. A node without a GPU (docker cannot select a GPU
device driver) is not a failure: the stage says so loudly and the image keeps its "not GPU-verified" mark,
which ``image facts`` and ``image verify`` show.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tarfile
import time
from dataclasses import dataclass, field

import docker.errors

from sparkserve.image.run import docker_dir, run_in_image
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.docker_client import docker_errors

GPU_SMOKE_PATH = "opt/sparkserve/gpu-smoke.json"
GPU_LABEL = "io.sparkserve.gpu-verified"
#: what docker says when it has no GPU to give (no NVIDIA container toolkit / no device)
NO_GPU = re.compile(r"could not select device driver|nvidia-container-cli|unknown or invalid runtime name: nvidia"
                    r"|no CUDA-capable device", re.I)


@dataclass
class GpuSmoke:
    ran: bool
    ok: bool
    why: str
    report: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {"ran": self.ran, "ok": self.ok, "why": self.why, "seconds": round(self.seconds, 1),
                "passed": self.report.get("passed"), "failed": self.report.get("failed"),
                "not_covered": self.report.get("not_covered"), "capability": self.report.get("capability")}


def tool_files() -> dict[str, bytes]:
    d = docker_dir() / "tools"
    return {f"tools/{n}": (d / n).read_bytes() for n in ("gpu_smoke.py", "image_facts.py")}


def gpu_smoke(node: Node, image: str, *, want_capability: str = "12.1", timeout: float = 900.0) -> GpuSmoke:
    """Run the GPU smoke program in ``image`` on ``node`` with every GPU (module docstring)."""
    t0 = time.monotonic()
    argv = ["python3", "/ctx/tools/gpu_smoke.py", "--want-capability", want_capability]
    try:
        rc, out, err = run_in_image(node, image, argv, files=tool_files(), step="gpu smoke", timeout=timeout,
                                    gpus=True)
    except NodeError as e:
        if NO_GPU.search(e.what):
            return GpuSmoke(False, False, f"no GPU on {node.name} (docker: {e.what.split(': ', 1)[-1][:160]})",
                            seconds=time.monotonic() - t0)
        raise
    try:
        report = dict(json.loads(out))
    except ValueError:
        last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
        return GpuSmoke(True, False, f"the smoke program printed no report: {last}", seconds=time.monotonic() - t0)
    failed = report.get("failed") or []
    why = "every check passed" if rc == 0 and not failed else \
        "; ".join(f"{r['check']}: {r['detail']}" for r in report.get("checks", []) if r.get("ok") is False)[:600]
    return GpuSmoke(True, rc == 0 and not failed, why, report, time.monotonic() - t0)


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode, ti.mtime = len(data), 0o644, int(time.time())
        tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def mark_gpu_verified(node: Node, tag: str, smoke: GpuSmoke) -> str:
    """Commit the passing report into ``tag`` (``/opt/sparkserve/gpu-smoke.json``, label
    ``io.sparkserve.gpu-verified=true``); the new image ID. The container is created, never started."""
    record = {"verified": True, "node": node.name, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "capability": smoke.report.get("capability"), "passed": smoke.report.get("passed"),
              "not_covered": smoke.report.get("not_covered"), "checks": smoke.report.get("checks")}
    repo, _, version = tag.rpartition(":")
    with docker_errors(node, "gpu smoke", f"mark {tag}"):
        client = node.docker()
        ctr = client.containers.create(tag, labels={"io.sparkserve.scratch": "1"})
        try:
            ctr.put_archive("/", _tar(GPU_SMOKE_PATH, (json.dumps(record, indent=1) + "\n").encode()))
            img = ctr.commit(repository=repo, tag=version, message="sparkserve: GPU smoke passed",
                             changes=[f"LABEL {GPU_LABEL}=true"])
        finally:
            with contextlib.suppress(docker.errors.APIError):
                ctr.remove(force=True)
    return str(img.id)


def verification_line(facts: dict) -> str:
    """How an image's facts say it was GPU-verified, in one line (``image verify``)."""
    mark = facts.get("gpu_smoke")
    if not isinstance(mark, dict):
        return "GPU-verified: unknown (no /opt/sparkserve/gpu-smoke.json: not built by sparkserve)"
    if mark.get("verified"):
        return (f"GPU-verified on {mark.get('node')} at {mark.get('at')} (capability {mark.get('capability')}; "
                f"not covered: {', '.join(mark.get('not_covered') or []) or 'none'})")
    return f"NOT GPU-verified: {mark.get('why') or 'the GPU smoke stage has not passed on this image'}"
