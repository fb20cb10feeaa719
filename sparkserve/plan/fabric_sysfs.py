"""A node's ConnectX-7 sysfs, typed: the probe's file contents (``class/net``, ``class/infiniband``: netdevs,
RDMA devices, their ports and GID tables) → :class:`SysfsFacts`, the input of
:func:`sparkserve.plan.fabric.resolve`.

Pure: :func:`parse_sysfs` only reads the dict it is given, tested on fixture trees. The files are read on the
node by the pre-flight probe (:mod:`sparkserve.deploy.probe`), or, for the launcher, by
:func:`sparkserve.plan.fabric_node.node_read_sysfs`. Standard library only: this source ships to the nodes
with plan/fabric.py's (:func:`sparkserve.plan.fabric_node.program`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str  # "RoCE v2", "IB/RoCE v1", or "" when unreadable
    ndev: str  # netdev the entry belongs to ("" when unknown)

    @property
    def ipv4(self) -> str | None:
        try:
            mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        except ValueError:
            return None
        return str(mapped) if mapped else None


@dataclass(frozen=True)
class Port:
    number: int
    state: str  # "ACTIVE", "DOWN", ...
    phys_state: str  # "LinkUp", "Disabled", ...
    link_layer: str  # "Ethernet" for RoCE
    gids: tuple[Gid, ...]
    rate: str = ""  # sysfs `rate`, e.g. "200 Gb/sec (4X HDR)" ("" when unreadable)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class Hca:
    name: str
    netdevs: tuple[str, ...]
    ports: dict[int, Port]


@dataclass(frozen=True)
class NetDev:
    name: str
    operstate: str
    mtu: int | None
    carrier: bool | None
    address: str = ""  # the MAC ("" when unreadable)
    speed: int | None = None  # Mb/s (None when unreadable, or no link)

    @property
    def up(self) -> bool:
        return self.operstate == "up" or (self.operstate == "unknown" and self.carrier is True)


@dataclass(frozen=True)
class SysfsFacts:
    netdevs: dict[str, NetDev]
    hcas: dict[str, Hca]


def _state(text: str | None) -> str:
    # "4: ACTIVE" → "ACTIVE", "5: LinkUp" → "LinkUp"
    if not text:
        return ""
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_sysfs(files: dict[str, str]) -> SysfsFacts:
    """Probe output → typed facts (pure)."""

    def listing(rel: str) -> list[str]:
        text = files.get(rel + "/", "")
        return [n for n in text.split("\n") if n]

    netdevs = {}
    for name in listing("class/net"):
        b = f"class/net/{name}"
        carrier = _int(files.get(f"{b}/carrier"))
        speed = _int(files.get(f"{b}/speed"))
        netdevs[name] = NetDev(name, files.get(f"{b}/operstate", "").strip().lower(),
                               _int(files.get(f"{b}/mtu")), None if carrier is None else carrier == 1,
                               files.get(f"{b}/address", "").strip().lower(),
                               speed if speed is not None and speed > 0 else None)
    hcas = {}
    for dev in listing("class/infiniband"):
        b = f"class/infiniband/{dev}"
        ports = {}
        for pname in listing(f"{b}/ports"):
            pn = _int(pname)
            if pn is None:
                continue
            p = f"{b}/ports/{pname}"
            gids = []
            for iname in listing(f"{p}/gids"):
                idx = _int(iname)
                gid = files.get(f"{p}/gids/{iname}")
                if idx is None or not gid:
                    continue
                gids.append(Gid(idx, gid.strip(), files.get(f"{p}/gid_attrs/types/{iname}", "").strip(),
                                files.get(f"{p}/gid_attrs/ndevs/{iname}", "").strip()))
            gids.sort(key=lambda g: g.index)
            ports[pn] = Port(pn, _state(files.get(f"{p}/state")), _state(files.get(f"{p}/phys_state")),
                             files.get(f"{p}/link_layer", "").strip(), tuple(gids),
                             files.get(f"{p}/rate", "").strip())
        hcas[dev] = Hca(dev, tuple(listing(f"{b}/device/net")), ports)
    return SysfsFacts(netdevs, hcas)

