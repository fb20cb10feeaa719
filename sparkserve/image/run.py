"""Running things in an image on a node, and where ``docker/`` is (shared by every `image` module).

    rc, out, err = run_in_image(node, image, ["python3", "-c", "…"], files={"tools/x.py": b"…"}, gpus=False)
    facts = image_facts(node, image)         # docker/tools/image_facts.py's JSON, run with the image's python3
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from pathlib import Path

import docker.errors
import docker.types

from sparkserve.errors import BadInput
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.docker_client import docker_errors


def docker_dir() -> Path:
    """``docker/`` of this checkout, or the copy packaged in the wheel (``sparkserve/docker``)."""
    here = Path(__file__).resolve().parents[1]
    for cand in (here.parent / "docker", here / "docker"):
        if (cand / "Dockerfile").is_file():
            return cand
    raise BadInput("docker/", "no Dockerfile next to sparkserve (neither a checkout nor the packaged copy)")


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def facts_program() -> str:
    return (docker_dir() / "tools" / "image_facts.py").read_text()


def run_in_image(node: Node, image: str, argv: list[str], *, files: dict[str, bytes] | None = None,
                 step: str = "image", timeout: float = 600.0, gpus: bool = False) -> tuple[int, str, str]:
    """Run ``argv`` (entrypoint overridden) in a throwaway container of ``image`` with no network; ``files``
    are put under ``/ctx`` first; ``gpus``: every GPU of the node (``docker run --gpus all``). (exit code,
    stdout, stderr); the container is always removed."""
    with docker_errors(node, step, image):
        client = node.docker()
        extra = {"device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]} if gpus else {}
        ctr = client.containers.create(image, command=argv[1:], entrypoint=[argv[0]], network_mode="none",
                                       labels={"io.sparkserve.scratch": "1"}, **extra)
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
