"""What is served: ``image`` (the image every rank runs), ``model`` (the target, a host path or a Hugging Face
repo id) and ``drafter`` (the speculative drafter's files)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from sparkserve.config.fields import HostPath, Strict, _host_path


class ImageConfig(Strict):
    ref: str = Field(min_length=1, description="the image every rank runs (tag, or tag@sha256:digest); the same "
                     "content fingerprint is required on every node (`image ship` copies it)")


# a Hugging Face repo id, `org/name` or `org/name@revision` (resolved on the nodes by nodes/hf_models)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
                      r"(@[A-Za-z0-9][A-Za-z0-9._/-]{0,199})?")


def _model_target(v: Path) -> Path:
    if not v.is_absolute() and _REPO_ID.fullmatch(str(v)):
        return v
    try:
        return _host_path(v)
    except ValueError:
        raise ValueError(f"{str(v)!r} must be an absolute path (it is bind-mounted on every node) or a Hugging "
                         "Face repo id, org/name[@revision], found in each node's cache") from None


ModelTarget = Annotated[Path, AfterValidator(_model_target)]


class ModelConfig(Strict):
    target: ModelTarget = Field(description="host path of the target model (a Hugging Face cache snapshot "
                                "path works), same on every node, mounted ro; or org/name[@revision]")
    served_name: str = Field(min_length=1, description="--served-model-name: the `model` the API serves and every "
                             "request names")

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        # vLLM takes any string, but every request and every /metrics line carries it: a 100,000-character name
        # served, and made `up` parse megabytes of /metrics (fault case D17)
        if len(v) > 256:
            raise ValueError(f"is {len(v)} characters long; at most 256")
        if not v.isprintable():
            raise ValueError(f"{v[:40]!r} contains a control character")
        return v


class DrafterConfig(Strict):
    path: HostPath = Field(description="host path of the drafter, same on every node, mounted ro")
    source: Path | None = Field(
        default=None,
        description="the controller's copy, synced to `path` on every node (default: `path`, when it exists "
        "on this machine; otherwise the head node's copy is the reference and must match on every node)",
    )

