"""Fabric detection on a node at run time, for ``launch_dflash2_tp2.sh``: the same rule as ``up``'s.

``up`` reads each node's sysfs in its pre-flight probe and resolves it here with :mod:`sparkserve.plan.fabric`
(``parse_sysfs`` → ``resolve`` → ``FabricFacts.env()``: interface, HCA(s), GID per the dual-rail rule).
The launcher has no sparkserve on the nodes, so :func:`program` ships those very modules' source
(plan/fabric_sysfs.py, plan/fabric.py) plus the two functions below (stdlib only) to each node, where
``python3 -c`` runs them on the node's own sysfs and prints the fabric variables as ``NAME=value`` lines. One
source: a change to the rule changes both.

Pure here (the functions run on the node); :func:`program` only assembles source text.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

from sparkserve.plan import fabric, fabric_sysfs
from sparkserve.plan.fabric import FabricError, resolve
from sparkserve.plan.fabric_sysfs import parse_sysfs

PROGRAM_DELIMITER = "SPARKSERVE_FABRIC_PROGRAM"


def node_read_sysfs(root: str) -> dict[str, str]:
    """On the node: the sysfs files fabric detection needs under ``root`` → {relative path: content}
    (listings as ``<dir>/`` → newline-separated names; unreadable files left out). The layout
    :func:`sparkserve.plan.fabric_sysfs.parse_sysfs` reads, as the pre-flight probe writes it."""
    import os

    out: dict[str, str] = {}

    def read(rel: str) -> str | None:
        try:
            with open(os.path.join(root, rel), "rb") as f:
                text = f.read(4096).decode("ascii", "replace").strip()
        except OSError:
            return None
        out[rel] = text
        return text

    def ls(rel: str) -> list[str]:
        try:
            names = sorted(os.listdir(os.path.join(root, rel)))
        except OSError:
            return []
        out[rel + "/"] = "\n".join(names)
        return names

    for ifname in ls("class/net"):
        for attr in ("operstate", "mtu", "carrier", "address", "speed"):
            read(f"class/net/{ifname}/{attr}")
    for dev in ls("class/infiniband"):
        base = f"class/infiniband/{dev}"
        ls(f"{base}/device/net")
        for port in ls(f"{base}/ports"):
            p = f"{base}/ports/{port}"
            for attr in ("state", "phys_state", "link_layer", "rate"):
                read(f"{p}/{attr}")
            for idx in ls(f"{p}/gids"):
                gid = read(f"{p}/gids/{idx}")
                if gid is None or gid.replace(":", "").strip("0") == "":
                    out.pop(f"{p}/gids/{idx}", None)
                    continue
                read(f"{p}/gid_attrs/types/{idx}")
                read(f"{p}/gid_attrs/ndevs/{idx}")
    return out


def node_detect(args: dict[str, object]) -> tuple[int, list[str]]:
    """On the node: (exit code, output lines). ``args``: node, fabric_ip, sysfs, interface, hca, gid_index
    (the config's values, ``auto`` or explicit). Lines: ``NAME=value`` for every fabric variable, or one
    ``error: <node>: fabric: …`` line (exit 2) when nothing usable is there."""
    import types

    root = str(args["sysfs"])
    cfg = types.SimpleNamespace(interface=args["interface"], hca=args["hca"], gid_index=args["gid_index"])
    try:
        facts = resolve(parse_sysfs(node_read_sysfs(root)), cfg, str(args["fabric_ip"]),  # type: ignore[arg-type]
                        node=str(args["node"]), sysfs_root=root)
    except FabricError as e:
        return 2, [f"error: {args['node']}: fabric: {e}"]
    env = facts.env()
    env.setdefault("MN_IF_NAME", env["NCCL_SOCKET_IFNAME"])  # the card sets all four socket names
    return 0, [f"{k}={v}" for k, v in env.items() if v and "\n" not in v]


def _node_main() -> None:
    import json
    import sys

    code, lines = node_detect(json.loads(sys.argv[1]))
    for line in lines:
        print(line, file=sys.stderr if code else sys.stdout)
    sys.exit(code)


def _shipped(module: ModuleType) -> str:
    """A module's source as the node program carries it: without ``from __future__`` (the program's first line)
    and without its ``from sparkserve.…`` imports (what it imports is earlier in the same program)."""
    text = Path(inspect.getsourcefile(module) or str(module.__file__)).read_text()
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(("from __future__ import", "from sparkserve.")))


def program() -> str:
    """The python3 program the launcher runs on each node: plan/fabric_sysfs.py's and plan/fabric.py's source,
    then the functions above."""
    source = "from __future__ import annotations\n\n" + "\n\n".join(_shipped(m) for m in (fabric_sysfs, fabric))
    own = "\n\n".join(inspect.getsource(f) for f in (node_read_sysfs, node_detect, _node_main))
    text = f"{source}\n\n{own}\n\nif __name__ == \"__main__\":\n    _node_main()\n"
    assert PROGRAM_DELIMITER not in text
    return text
