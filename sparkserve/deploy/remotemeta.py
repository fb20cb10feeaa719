"""Inspect a model directory that lives only on a node: copy its metadata, not its weights.

Small files (config.json, index files, mask_embedding.pt) are copied whole; each ``*.safetensors``
becomes a sparse local stub holding the real header at the real size, so the header reader (which
checks offsets against the file size) sees what it would see on the node, for no disk and one round trip
— for several directories at once (`up` and `validate` read the drafter and the target in the same run).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from sparkserve.errors import BadInput
from sparkserve.nodes.base import Node

SMALL_LIMIT = 64 * 2**20

_PROGRAM = r"""
import base64, json, os, struct, sys
a = json.loads(sys.stdin.read())
limit = a["limit"]

def meta(root):
    out = {"exists": os.path.isdir(root), "files": {}}
    if not out["exists"]:
        return out
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name)
        if not os.path.isfile(p):
            continue
        size = os.path.getsize(p)
        if name.endswith(".safetensors"):
            with open(p, "rb") as f:
                head = f.read(8)
                n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
                data = head + (f.read(n) if n <= 100 * 2**20 else b"")
            out["files"][name] = {"size": size, "head": base64.b64encode(data).decode()}
        elif size <= limit and (name.endswith((".json", ".pt", ".txt", ".model")) or name == "tokenizer.json"):
            with open(p, "rb") as f:
                out["files"][name] = {"size": size, "data": base64.b64encode(f.read()).decode()}
    return out

print(json.dumps([meta(root) for root in a["roots"]]))
"""


def fetch_metas(node: Node, wanted: list[tuple[str, Path, str]]) -> list[Path | BadInput]:
    """Mirror each ``(remote_dir, into, field)``'s metadata into ``into``, all in ONE run on ``node``; per
    directory its ``into``, or the BadInput naming ``field`` when it is missing there."""
    if not wanted:
        return []
    question = {"roots": [remote_dir for remote_dir, _, _ in wanted], "limit": SMALL_LIMIT}
    res = node.run(["python3", "-c", _PROGRAM], stdin=json.dumps(question).encode(), step="inspect", timeout=60)
    answers = json.loads(res.stdout)
    out: list[Path | BadInput] = []
    for (remote_dir, into, field), data in zip(wanted, answers, strict=True):
        if not data["exists"]:
            out.append(BadInput(field, f"{remote_dir} does not exist on {node.name}"))
            continue
        _mirror(data["files"], into)
        out.append(into)
    return out


def fetch_meta(node: Node, remote_dir: str, into: Path, *, field: str) -> Path:
    """Mirror ``remote_dir``'s metadata into ``into``; BadInput naming ``field`` when it is missing."""
    got = fetch_metas(node, [(remote_dir, into, field)])[0]
    if isinstance(got, BadInput):
        raise got
    return got


def _mirror(files: dict[str, dict[str, object]], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for name, f in files.items():
        dst = into / os.path.basename(name)
        if "data" in f:
            dst.write_bytes(base64.b64decode(str(f["data"])))
        else:
            with dst.open("wb") as out:
                out.write(base64.b64decode(str(f["head"])))
                out.truncate(int(str(f["size"])))  # sparse: real size, no blocks
