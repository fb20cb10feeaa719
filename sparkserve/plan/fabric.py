"""ConnectX-7 facts on a node (sysfs file contents) → the NCCL / GLOO / TP / UCX environment for that node.

    facts = resolve(parse_sysfs(files), cfg.fabric, node_cfg.fabric_ip, node=name)
    facts.env()  # {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", ..., "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
                 #  "NCCL_IB_GID_INDEX": "3"}
    build_plan(cfg, fabric_env=fabric_envs({name: facts, ...}))

How (spark-field-notes.md section 2): the interface is the netdev whose RDMA device has a **RoCE v2** GID
entry encoding this node's ``fabric_ip`` (``::ffff:a.b.c.d``); ``NCCL_IB_GID_INDEX`` is that entry's
index — resolved per node, because it differs between nodes and drifts after link events; ``NCCL_IB_HCA``
is that RDMA device plus its PCIe "twin" (``rocep1s0f1`` + ``roceP2p1s0f1``) when the twin's port is
ACTIVE. Explicit ``fabric.interface`` / ``hca`` / ``gid_index`` values are used as given (and checked).
No value is ever empty: NCCL reads a defined-empty GID index as 0, the link-local entry.

Pure: :func:`parse_sysfs` (file contents → :class:`SysfsFacts`) and :func:`resolve` (→
:class:`FabricFacts`), tested on fixture trees. The files are read on the node by the pre-flight probe
(:mod:`sparkserve.deploy.probe`), in the same round trip as every other node check.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkserve.config import FabricConfig

ROCE_V2 = "RoCE v2"
RECOMMENDED_MTU = 9000


# -- parsing ----------------------------------------------------------------------------------------------


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
        netdevs[name] = NetDev(name, files.get(f"{b}/operstate", "").strip().lower(),
                               _int(files.get(f"{b}/mtu")), None if carrier is None else carrier == 1)
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
                             files.get(f"{p}/link_layer", "").strip(), tuple(gids))
        hcas[dev] = Hca(dev, tuple(listing(f"{b}/device/net")), ports)
    return SysfsFacts(netdevs, hcas)


# -- resolution -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FabricFacts:
    """What ``up`` and ``doctor`` need to know about one node's fabric."""

    node: str
    interface: str
    hcas: tuple[str, ...]
    gid_index: int
    fabric_ip: str
    mtu: int | None
    link_up: bool
    port_states: dict[str, str] = field(default_factory=dict)  # hca → port 1 state, for every listed HCA
    warnings: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """The per-node fabric environment (never an empty value)."""
        env = {
            "NCCL_SOCKET_IFNAME": self.interface,
            "GLOO_SOCKET_IFNAME": self.interface,
            "TP_SOCKET_IFNAME": self.interface,
            "UCX_NET_DEVICES": self.interface,
            "NCCL_IB_HCA": ",".join(self.hcas),
            "NCCL_IB_GID_INDEX": str(self.gid_index),
        }
        assert all(env.values()), env
        return env

    def as_dict(self) -> dict[str, object]:
        return {"interface": self.interface, "hcas": list(self.hcas), "gid_index": self.gid_index,
                "fabric_ip": self.fabric_ip, "mtu": self.mtu, "link_up": self.link_up,
                "port_states": dict(self.port_states), "warnings": list(self.warnings), "env": self.env()}


class FabricError(ValueError):
    """Nothing usable found (the node checks report it as the node's failed ``fabric`` check)."""


def twin_key(name: str) -> str:
    """``roceP2p1s0f1`` and ``rocep1s0f1`` (or ``enP2p1s0f1np1`` / ``enp1s0f1np1``) share a key."""
    return re.sub(r"P\d+(?=p\d)", "", name)


def _roce_ports(facts: SysfsFacts) -> list[tuple[Hca, Port]]:
    return [(h, p) for h in facts.hcas.values() for p in h.ports.values()]


def _ndev_of(hca: Hca, gid: Gid) -> str:
    return gid.ndev or (hca.netdevs[0] if hca.netdevs else "")


def _ipv4_gids(facts: SysfsFacts) -> list[tuple[Hca, Port, Gid]]:
    return [(h, p, g) for h, p in _roce_ports(facts) for g in p.gids if g.ipv4 and g.type == ROCE_V2]


def _inventory(facts: SysfsFacts) -> str:
    seen = [f"{h.name}/{p.number} {g.ipv4} ({_ndev_of(h, g) or '?'}, GID {g.index})"
            for h, p, g in _ipv4_gids(facts)]
    return ", ".join(seen) if seen else "no RoCE v2 IPv4 GID entries at all"


def resolve(facts: SysfsFacts, fabric: FabricConfig, fabric_ip: str, *, node: str = "",
            sysfs_root: str = "/sys") -> FabricFacts:
    """Pick interface, HCAs and GID index for ``fabric_ip``; raise FabricError if nothing usable."""
    ib_dir = f"{sysfs_root.rstrip('/')}/class/infiniband"
    if not facts.hcas:
        raise FabricError(f"no RDMA devices under {ib_dir} (CX-7 driver loaded? fabric.sysfs_root right?)")
    matches = [(h, p, g) for h, p, g in _ipv4_gids(facts) if g.ipv4 == fabric_ip]
    want_if = None if fabric.interface == "auto" else fabric.interface
    if want_if is not None:
        if want_if not in facts.netdevs:
            have = ", ".join(facts.netdevs)
            raise FabricError(f"fabric.interface {want_if} does not exist (netdevs: {have})")
        matches = [(h, p, g) for h, p, g in matches if _ndev_of(h, g) == want_if]
    if not matches:
        on = f" on {want_if}" if want_if else ""
        raise FabricError(f"no RoCE v2 GID entry for fabric_ip {fabric_ip}{on} under {ib_dir}; "
                          f"found: {_inventory(facts)} — check nodes[].fabric_ip and the CX-7 addresses")
    hca, port, gid = matches[0]
    iface = want_if or _ndev_of(hca, gid)
    if not iface:
        raise FabricError(f"cannot tell which netdev {hca.name} belongs to (no gid_attrs/ndevs, device/net)")
    warnings: list[str] = []

    # GID index
    if fabric.gid_index == "auto":
        gid_index = gid.index
    else:
        gid_index = int(fabric.gid_index)
        if gid_index != gid.index:
            warnings.append(f"fabric.gid_index {gid_index} is set but {fabric_ip}'s RoCE v2 entry is "
                            f"{gid.index}")

    # HCAs: the chosen device and its ACTIVE twin(s)
    port_states = {hca.name: port.state}
    if fabric.hca == "auto":
        hcas = [hca.name]
        for other in sorted(facts.hcas.values(), key=lambda h: h.name):
            if other.name == hca.name or twin_key(other.name) != twin_key(hca.name):
                continue
            op = other.ports.get(port.number) or next(iter(other.ports.values()), None)
            if op is None:
                continue
            port_states[other.name] = op.state
            if op.active:
                hcas.append(other.name)
                twin_gids = {g.index for g in op.gids if g.type == ROCE_V2 and g.ipv4}
                if twin_gids and gid_index not in twin_gids:
                    warnings.append(f"twin {other.name} has its RoCE v2 IPv4 GID at {sorted(twin_gids)}, "
                                    f"not {gid_index} (NCCL_IB_GID_INDEX applies to both)")
            else:
                warnings.append(f"twin {other.name} port {op.number} is {op.state or 'unknown'}: NCCL_IB_HCA "
                                f"uses {hca.name} only (about half the bandwidth)")
    else:
        hcas = [h.strip() for h in fabric.hca.split(",") if h.strip()]
        if not hcas:
            raise FabricError("fabric.hca is empty")
        for h in hcas:
            if h not in facts.hcas:
                raise FabricError(f"fabric.hca {h} does not exist (RDMA devices: {', '.join(facts.hcas)})")
            hp = facts.hcas[h].ports.get(1) or next(iter(facts.hcas[h].ports.values()), None)
            port_states[h] = hp.state if hp else ""

    # link state and MTU
    nd = facts.netdevs.get(iface)
    if nd is None:
        raise FabricError(f"{hca.name}'s netdev {iface} is not under {sysfs_root.rstrip('/')}/class/net")
    if not nd.up:
        raise FabricError(f"{iface} is down (operstate {nd.operstate or 'unknown'}); check the QSFP cable")
    if not port.active:
        raise FabricError(f"{hca.name} port {port.number} is {port.state or 'unknown'} "
                          f"(phys {port.phys_state or '?'}), not ACTIVE")
    if port.link_layer and port.link_layer != "Ethernet":
        warnings.append(f"{hca.name} link layer is {port.link_layer}, expected Ethernet (RoCE)")
    if nd.mtu is not None and nd.mtu < RECOMMENDED_MTU:
        warnings.append(f"{iface} MTU is {nd.mtu}; {RECOMMENDED_MTU} is recommended for the CX-7 link")
    return FabricFacts(node=node, interface=iface, hcas=tuple(hcas), gid_index=gid_index, fabric_ip=fabric_ip,
                       mtu=nd.mtu, link_up=True, port_states=port_states, warnings=tuple(warnings))


def fabric_envs(facts: dict[str, FabricFacts]) -> dict[str, dict[str, str]]:
    """``build_plan(fabric_env=...)``'s argument."""
    return {name: f.env() for name, f in facts.items()}
