"""The target checkpoint's manifest, cheap enough to take on every node at every `up`: the index file's sha256,
every shard's name and size, and one sha256 over every shard's safetensors header (tensor names, dtypes, shapes,
offsets) — no weights are read.

    m = TargetManifest.from_answer(target_manifest(path))     # the same function runs on a node (by source)
    why = m.differs_from(head_manifest)                         # None, or the first difference in words

Why on every node: with expert parallelism rank 1 holds half the experts, and real vLLM loads a checkpoint with
missing tensors without a word (shared/docs/real-vllm-notes.md). A partial rsync to the follower, or an older copy,
must be refused before boot, as the drafter's manifest already is.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

INDEX = "model.safetensors.index.json"
MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header


def target_manifest(path: str) -> dict:  # type: ignore[type-arg]
    """The manifest of the checkpoint directory ``path`` as JSON data (stdlib only, self-contained: the node
    probe runs it by source). ``error`` when ``path`` is not a readable directory."""
    import hashlib
    import json as _json
    import os
    import struct

    out: dict = {"index_sha256": None, "indexed": [], "shards": {}, "headers_sha256": None,
                           "bad_headers": [], "error": None}
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    except OSError as e:
        out["error"] = f"{path}: {e.strerror}"
        return out
    index = os.path.join(path, "model.safetensors.index.json")
    try:
        with open(index, "rb") as f:
            raw = f.read(64 << 20)
        out["index_sha256"] = hashlib.sha256(raw).hexdigest()
        wm = _json.loads(raw).get("weight_map") or {}
        out["indexed"] = sorted({str(v) for v in wm.values()}) if isinstance(wm, dict) else []
    except (OSError, ValueError, AttributeError):
        pass
    h = hashlib.sha256()
    for n in names:
        p = os.path.join(path, n)
        try:
            size = os.stat(p).st_size
            with open(p, "rb") as f:
                head = f.read(8)
                length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
                header = f.read(length) if 0 <= length <= 100 * 2**20 and 8 + length <= size else None
        except OSError:
            size, header = -1, None
        out["shards"][n] = size
        if header is None:
            out["bad_headers"].append(n)
            continue
        h.update(n.encode() + b"\0" + header + b"\0")
    out["headers_sha256"] = h.hexdigest()
    return out


NODE_SOURCE = inspect.getsource(target_manifest)


@dataclass(frozen=True)
class TargetManifest:
    index_sha256: str | None
    indexed: list[str]
    shards: dict[str, int]
    headers_sha256: str | None
    bad_headers: list[str] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_answer(cls, a: Mapping[str, Any]) -> TargetManifest:
        return cls(a.get("index_sha256"), list(a.get("indexed") or []),
                   {str(k): int(v) for k, v in (a.get("shards") or {}).items()}, a.get("headers_sha256"),
                   list(a.get("bad_headers") or []), a.get("error"))

    def problems(self) -> str | None:
        """What is wrong with this copy on its own (shards its index names that are not there, unreadable
        headers); None when nothing is."""
        if self.error:
            return self.error
        missing = [n for n in self.indexed if n not in self.shards]
        if missing:
            return f"{len(missing)} shard(s) its index names are missing: {_few(missing)}"
        if self.bad_headers:
            return f"unreadable safetensors header in {_few(self.bad_headers)} (a partial copy?)"
        return None

    def differs_from(self, ref: TargetManifest) -> str | None:
        """The first difference from the reference copy ``ref``, in words; None when they are the same."""
        if self.index_sha256 != ref.index_sha256:
            return "its model.safetensors.index.json differs" if self.index_sha256 and ref.index_sha256 else (
                "it has no model.safetensors.index.json" if ref.index_sha256 else "it has an index file the other "
                "copy lacks")
        gone = sorted(set(ref.shards) - set(self.shards))
        if gone:
            return f"{len(gone)} shard(s) missing: {_few(gone)}"
        extra = sorted(set(self.shards) - set(ref.shards))
        if extra:
            return f"{len(extra)} shard(s) the other copy lacks: {_few(extra)}"
        sizes = [n for n in ref.shards if ref.shards[n] != self.shards[n]]
        if sizes:
            n = sizes[0]
            return f"{len(sizes)} shard(s) differ in size, first {n}: {self.shards[n]} bytes, not {ref.shards[n]}"
        if self.headers_sha256 != ref.headers_sha256:
            return "the safetensors headers differ (tensor names, shapes or dtypes): another revision"
        return None


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
