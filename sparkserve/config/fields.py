"""The config's shared building blocks: the strict section base (unknown keys refused) and the field types
several sections use — sizes (``8GiB`` or bytes), absolute host paths, node-side directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer

from sparkserve.units import parse_size


def _size(v: Any) -> int:
    try:
        return parse_size(v)
    except ValueError as e:  # re-raised by pydantic as a field error
        raise ValueError(str(e)) from None


ByteSize = Annotated[int, BeforeValidator(_size), PlainSerializer(lambda n: n, return_type=int)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)



def _host_path(v: Path) -> Path:
    s = str(v)
    if not v.is_absolute():
        raise ValueError(f"{s!r} must be an absolute path (it is bind-mounted on every node)")
    if any(c in s for c in "\n\r\0"):
        raise ValueError(f"{s!r} contains a control character")
    return v


HostPath = Annotated[Path, AfterValidator(_host_path)]


def _run_dir(v: str) -> str:
    if not (v.startswith("/") or v.startswith("~/")):
        raise ValueError(f"{v!r} must be an absolute path or start with ~/ (the node user's home)")
    if any(c in v for c in "\n\r\0") or ".." in v.split("/"):
        raise ValueError(f"{v!r} contains a control character or a .. component")
    return v.rstrip("/") or "/"


CacheRoot = Annotated[str, AfterValidator(_run_dir)]
