"""Inspect a model directory that lives only on a node: copy its metadata, not its weights.

Small files (config.json, index files, mask_embedding.pt) are copied whole; each ``*.safetensors``
becomes a sparse local stub holding the real header at the real size, so the header reader (which
checks offsets against the file size) sees what it would see on the node, for no disk and one round trip.
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
root, limit = a["root"], a["limit"]
out = {"exists": os.path.isdir(root), "files": {}}
if out["exists"]:
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
print(json.dumps(out))
"""


def fetch_meta(node: Node, remote_dir: str, into: Path, *, field: str) -> Path:
    """Mirror ``remote_dir``'s metadata into ``into``; BadInput naming ``field`` when it is missing."""
    res = node.run(["python3", "-c", _PROGRAM], stdin=json.dumps({"root": remote_dir, "limit": SMALL_LIMIT}).encode(),
                   step="inspect", timeout=60)
    data = json.loads(res.stdout)
    if not data["exists"]:
        raise BadInput(field, f"{remote_dir} does not exist on {node.name}")
    into.mkdir(parents=True, exist_ok=True)
    for name, f in data["files"].items():
        dst = into / os.path.basename(name)
        if "data" in f:
            dst.write_bytes(base64.b64decode(f["data"]))
        else:
            with dst.open("wb") as out:
                out.write(base64.b64decode(f["head"]))
                out.truncate(int(f["size"]))  # sparse: real size, no blocks
    return into
