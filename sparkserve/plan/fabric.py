"""ConnectX-7 facts on a node (sysfs file contents) → the NCCL / GLOO / TP / UCX environment for that node.

    facts = resolve(parse_sysfs(files), cfg.fabric, node_cfg.fabric_ip, node=name)
    rec = facts.fabric_env()  # FabricEnv: .env, .unset, .rule, .warnings (the record the plan builder reads)
    rec.env  # dual rail: {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", ..., "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
             #  "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET",
             #  "NCCL_IB_ADDR_RANGE": "192.168.200.0/23"}        (no NCCL_IB_GID_INDEX: rec.unset names it)
    build_plan(cfg, fabric_env=fabric_envs({name: facts, ...}))

How (spark-field-notes.md section 2, realism-review D3): the interface is the netdev whose RDMA device has a
**RoCE v2** GID entry encoding this node's ``fabric_ip`` (``::ffff:a.b.c.d``). Its PCIe "twin" (``rocep1s0f1`` +
``roceP2p1s0f1``) joins ``NCCL_IB_HCA`` only when its port is ACTIVE **and** it has its own RoCE v2 IPv4 GID (an
unaddressed twin has none: NCCL would build its QPs on an empty or link-local GID and fail init).

* One HCA: ``NCCL_IB_GID_INDEX`` is that entry's index, resolved per node (it differs between nodes and drifts
  after link events; one literal for both ranks wedges NCCL — MiaAI start script).
* Several HCAs (the dual-rail rule): one global ``NCCL_IB_GID_INDEX`` applies to every listed HCA, and kits
  exist with the twin's v2 GID at another index (5). So the index is left unset and NCCL picks it per HCA:
  ``NCCL_IB_ROCE_VERSION_NUM=2``, ``NCCL_IB_ADDR_FAMILY=AF_INET``, ``NCCL_IB_ADDR_RANGE=<subnet>``. NCCL keeps
  only GIDs inside that range (NVIDIA/nccl ``src/transport/net_ib/connect.cc``: ``envIbAddrRange``,
  ``matchGidAddrPrefix``, ``ncclUpdateGidIndex``), so the range is the smallest network holding every listed
  HCA's own address (never narrower than /24): the NVIDIA two-subnet layout (``…100.10/24`` + ``…101.10/24``)
  gets a /23. sysfs holds no prefix lengths, hence the derivation. :func:`nccl_gid_pick` replays NCCL's own
  choice on the GID table, so ``doctor`` can show which entry each HCA will use.

Explicit ``fabric.interface`` / ``hca`` / ``gid_index`` values are used as given (and checked). No value is ever
empty: NCCL reads a defined-empty GID index as 0, the link-local entry.

Pure: :func:`~sparkserve.plan.fabric_sysfs.parse_sysfs` (file contents → :class:`SysfsFacts`, in
:mod:`sparkserve.plan.fabric_sysfs`) and :func:`resolve` (→ :class:`FabricFacts`), tested on fixture trees.
The files are read on the node by the pre-flight probe (:mod:`sparkserve.deploy.probe`), in the same round
trip as every other node check. :func:`compare_nodes` sets the nodes' facts side by side (MTU, link rate, the
HCA set).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkserve.plan.fabric_sysfs import Gid, Hca, Port, SysfsFacts

if TYPE_CHECKING:
    from sparkserve.config import FabricConfig

ROCE_V2 = "RoCE v2"
RECOMMENDED_MTU = 9000


# -- resolution -------------------------------------------------------------------------------------------

#: The dual-rail variables (several HCAs): NCCL resolves the GID per HCA from these (connect.cc).
ROCE_VERSION_NUM = "2"
ADDR_FAMILY = "AF_INET"
WIDEST_PREFIX = 24  # NCCL_IB_ADDR_RANGE is never narrower than a /24 (the Spark netplan layout's subnet)
#: NCCL_DEBUG_SUBSYS with NCCL_DEBUG=INFO: only the subsystems that print while communicators are set up (the boot
#: window), among them the transport line the faults gate reads (`NET/IB : Using …` / `Using network IB`).
NCCL_BOOT_SUBSYS = "INIT,NET"


@dataclass(frozen=True)
class FabricEnv:
    """One node's fabric as the plan builder consumes it (plan/build.py ``fabric_env``).

    ``env``: the variables to set (never an empty value). ``unset``: variables that must stay unset on this node
    (several HCAs: ``NCCL_IB_GID_INDEX`` — a value would apply to every HCA). ``rule``: ``single-hca`` or
    ``dual-rail``. ``warnings``: what ``doctor`` prints, each with its fix."""

    node: str
    env: dict[str, str]
    unset: tuple[str, ...]
    rule: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class FabricFacts:
    """What ``up`` and ``doctor`` need to know about one node's fabric."""

    node: str
    interface: str
    hcas: tuple[str, ...]
    gid_index: int  # the fabric_ip's own RoCE v2 entry on the first HCA (set only when it is the one HCA)
    fabric_ip: str
    mtu: int | None
    link_up: bool
    port_states: dict[str, str] = field(default_factory=dict)  # hca → port state, for every HCA considered
    warnings: tuple[str, ...] = ()
    hca_gids: dict[str, int] = field(default_factory=dict)  # listed hca → the GID entry NCCL will use
    hca_ips: dict[str, str] = field(default_factory=dict)  # listed hca → its own RoCE v2 IPv4 address
    rates: dict[str, str] = field(default_factory=dict)  # listed hca → its port's link rate
    mtus: dict[str, int | None] = field(default_factory=dict)  # listed hca → its netdev's MTU
    addr_range: str | None = None  # NCCL_IB_ADDR_RANGE (several HCAs only)
    pinned_gid: bool = False  # fabric.gid_index was given: it is set whatever the HCA count

    @property
    def dual_rail(self) -> bool:
        return len(self.hcas) > 1

    def env(self) -> dict[str, str]:
        """The per-node fabric environment (never an empty value)."""
        env = {
            "NCCL_SOCKET_IFNAME": self.interface,
            "GLOO_SOCKET_IFNAME": self.interface,
            "TP_SOCKET_IFNAME": self.interface,
            "UCX_NET_DEVICES": self.interface,
            "NCCL_IB_HCA": ",".join(self.hcas),
        }
        if not self.dual_rail or self.pinned_gid:
            env["NCCL_IB_GID_INDEX"] = str(self.gid_index)
        if self.dual_rail and not self.pinned_gid:
            assert self.addr_range, self
            env |= {"NCCL_IB_ROCE_VERSION_NUM": ROCE_VERSION_NUM, "NCCL_IB_ADDR_FAMILY": ADDR_FAMILY,
                    "NCCL_IB_ADDR_RANGE": self.addr_range}
        assert all(env.values()), env
        return env

    def fabric_env(self) -> FabricEnv:
        """The record the plan builder reads: the env, what must stay unset, the rule applied, the warnings."""
        unset = ("NCCL_IB_GID_INDEX",) if self.dual_rail and not self.pinned_gid else ()
        return FabricEnv(self.node, self.env(), unset, "dual-rail" if self.dual_rail else "single-hca",
                         self.warnings)

    def as_dict(self) -> dict[str, object]:
        return {"interface": self.interface, "hcas": list(self.hcas), "gid_index": self.gid_index,
                "fabric_ip": self.fabric_ip, "mtu": self.mtu, "link_up": self.link_up,
                "port_states": dict(self.port_states), "warnings": list(self.warnings), "env": self.env(),
                "rule": self.fabric_env().rule, "hca_gids": dict(self.hca_gids), "hca_ips": dict(self.hca_ips),
                "rates": dict(self.rates), "mtus": dict(self.mtus), "addr_range": self.addr_range}


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


def _own_v2_ipv4(hca: Hca, port: Port) -> Gid | None:
    """The HCA's own RoCE v2 IPv4 GID on ``port``: an entry of its own netdev (first one), or None."""
    own = [g for g in port.gids if g.ipv4 and g.type == ROCE_V2
           and (not g.ndev or not hca.netdevs or g.ndev in hca.netdevs)]
    return own[0] if own else None


def _inventory(facts: SysfsFacts) -> str:
    seen = [f"{h.name}/{p.number} {g.ipv4} ({_ndev_of(h, g) or '?'}, GID {g.index})"
            for h, p, g in _ipv4_gids(facts)]
    return ", ".join(seen) if seen else "no RoCE v2 IPv4 GID entries at all"


def addr_range(ips: list[str]) -> str:
    """``NCCL_IB_ADDR_RANGE`` for HCAs with these own addresses: the smallest IPv4 network holding them all, never
    narrower than /24 (192.168.200.1 + 192.168.201.1 → 192.168.200.0/23)."""
    nets = [ipaddress.IPv4Network(f"{ip}/{WIDEST_PREFIX}", strict=False) for ip in ips]
    prefix = WIDEST_PREFIX
    while prefix > 0 and len({n.supernet(new_prefix=prefix) for n in nets}) > 1:
        prefix -= 1
    return str(nets[0].supernet(new_prefix=prefix))


def nccl_gid_pick(port: Port, cidr: str | None, roce_version: int = 2) -> int:
    """The GID index NCCL picks on ``port`` with ``NCCL_IB_GID_INDEX`` unset, ``NCCL_IB_ADDR_FAMILY=AF_INET``,
    ``NCCL_IB_ROCE_VERSION_NUM=roce_version`` and ``NCCL_IB_ADDR_RANGE=cidr`` — the walk of NVIDIA/nccl
    ``src/transport/net_ib/connect.cc`` (``ncclIbGetGidIndex`` → ``ncclUpdateGidIndex`` over indexes 1…, starting
    from 0). Entries the probe could not read (unused ones) count as the all-zero GID, which NCCL never takes."""
    by_index = {g.index: g for g in port.gids}
    net = ipaddress.IPv4Network(cidr) if cidr else None

    def fam(g: Gid | None) -> str:
        return "inet" if g is not None and g.ipv4 is not None else "inet6"

    def valid(g: Gid | None) -> bool:  # configured and not link-local
        return g is not None and not g.gid.lower().startswith("fe80") and g.gid.replace(":", "").strip("0") != ""

    def in_range(g: Gid | None) -> bool:
        return net is None or (g is not None and g.ipv4 is not None and ipaddress.IPv4Address(g.ipv4) in net)

    def version(g: Gid | None) -> int:
        t = (g.type if g else "").strip()
        return 2 if t.startswith("RoCE v2") else 1 if t in ("IB/RoCE v1", "RoCE v1") else -1

    pick = 0
    for cand_i in range(1, max(by_index, default=0) + 1):
        cur, cand = by_index.get(pick), by_index.get(cand_i)
        if fam(cand) != "inet" or not in_range(cand):
            continue
        family_change = fam(cur) != "inet"  # an IPv4 entry replaces an IPv6 one
        better = valid(cand) and (version(cur) != version(cand) or not valid(cur)) and version(cand) == roce_version
        if family_change or better:
            pick = cand_i
    return pick


def _port_of(hca: Hca, number: int) -> Port | None:
    return hca.ports.get(number) or next(iter(hca.ports.values()), None)


def resolve(facts: SysfsFacts, fabric: FabricConfig, fabric_ip: str, *, node: str = "",
            sysfs_root: str = "/sys") -> FabricFacts:
    """Pick interface, HCAs and the GID rule for ``fabric_ip``; raise FabricError if nothing usable."""
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
    pinned = fabric.gid_index != "auto"
    gid_index = gid.index if not pinned else int(fabric.gid_index)
    if pinned and gid_index != gid.index:
        warnings.append(f"fabric.gid_index {gid_index} is set but {fabric_ip}'s RoCE v2 entry is {gid.index} "
                        f"— fix: set fabric.gid_index: auto")

    # HCAs: the chosen device and each ACTIVE twin that has its own RoCE v2 IPv4 GID
    port_states = {hca.name: port.state}
    own_ip = {hca.name: fabric_ip}
    own_gid = {hca.name: gid.index}
    ports = {hca.name: port}
    if fabric.hca == "auto":
        hcas = [hca.name]
        for other in sorted(facts.hcas.values(), key=lambda h: h.name):
            if other.name == hca.name or twin_key(other.name) != twin_key(hca.name):
                continue
            op = _port_of(other, port.number)
            if op is None:
                continue
            port_states[other.name] = op.state
            tg = _own_v2_ipv4(other, op)
            if not op.active:
                warnings.append(f"twin {other.name} port {op.number} is {op.state or 'unknown'}: NCCL_IB_HCA "
                                f"uses {hca.name} only (about half the bandwidth) — fix: cable and bring up "
                                f"{', '.join(other.netdevs) or other.name}")
            elif tg is None:
                twin_if = ", ".join(other.netdevs) or other.name
                warnings.append(f"twin {other.name} is ACTIVE but has no RoCE v2 IPv4 GID (no IPv4 address on "
                                f"{twin_if}): left out of NCCL_IB_HCA, {hca.name} only (about half the bandwidth) "
                                f"— fix: give {twin_if} its own address on a second subnet (netplan), on every node")
            else:
                hcas.append(other.name)
                ports[other.name] = op
                own_ip[other.name] = str(tg.ipv4)
                own_gid[other.name] = tg.index
    else:
        hcas = [h.strip() for h in fabric.hca.split(",") if h.strip()]
        if not hcas:
            raise FabricError("fabric.hca is empty")
        for h in hcas:
            if h not in facts.hcas:
                raise FabricError(f"fabric.hca {h} does not exist (RDMA devices: {', '.join(facts.hcas)})")
            hp = _port_of(facts.hcas[h], port.number)
            port_states[h] = hp.state if hp else ""
            if hp is None:
                continue
            ports[h] = hp
            if h == hca.name:
                continue
            tg = _own_v2_ipv4(facts.hcas[h], hp)
            if tg is not None:
                own_ip[h], own_gid[h] = str(tg.ipv4), tg.index
            elif len(hcas) > 1 and not pinned:
                raise FabricError(f"fabric.hca lists {h}, which has no RoCE v2 IPv4 GID: with several HCAs NCCL "
                                  f"picks each one's GID by address — give it an IPv4 address or leave it out")

    cidr: str | None = None
    hca_gids: dict[str, int] = {}
    if len(hcas) > 1 and pinned:
        for h in hcas:
            hp = ports.get(h)
            at = {g.index: g for g in hp.gids} if hp else {}
            g = at.get(gid_index)
            if g is None or g.type != ROCE_V2 or not g.ipv4:
                raise FabricError(f"fabric.gid_index {gid_index} applies to every HCA in NCCL_IB_HCA, but {h} has "
                                  f"no RoCE v2 IPv4 GID at {gid_index} — fix: set fabric.gid_index: auto (with "
                                  f"several HCAs NCCL then picks each HCA's own)")
        hca_gids = {h: gid_index for h in hcas}
    elif len(hcas) > 1:
        cidr = addr_range([own_ip[h] for h in hcas if h in own_ip])
        hca_gids = {h: nccl_gid_pick(ports[h], cidr) for h in hcas if h in ports}
        for h, picked in hca_gids.items():
            if h in own_gid and picked != own_gid[h]:
                warnings.append(f"NCCL will pick GID {picked} on {h}, not its {own_ip[h]} entry {own_gid[h]} "
                                f"(more than one IPv4 address in {cidr}?) — fix: one IPv4 address per CX-7 netdev")
    else:
        hca_gids = {hcas[0]: gid_index}

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
    mtus: dict[str, int | None] = {}
    for h in hcas:
        dev = facts.hcas[h]
        netdev = iface if h == hca.name else (dev.netdevs[0] if dev.netdevs else "")
        m = facts.netdevs[netdev].mtu if netdev in facts.netdevs else None
        mtus[h] = m
        if m is not None and m < RECOMMENDED_MTU:
            warnings.append(mtu_warning(netdev, m))
    return FabricFacts(node=node, interface=iface, hcas=tuple(hcas), gid_index=gid_index, fabric_ip=fabric_ip,
                       mtu=nd.mtu, link_up=True, port_states=port_states, warnings=tuple(warnings),
                       hca_gids=hca_gids, hca_ips={h: own_ip[h] for h in hcas if h in own_ip},
                       rates={h: ports[h].rate for h in hcas if h in ports}, mtus=mtus, addr_range=cidr,
                       pinned_gid=pinned)


def mtu_warning(netdev: str, mtu: int) -> str:
    """A small MTU, with its fix line (a fresh DGX OS port runs at 1500: the RoCE path MTU is then 1024)."""
    return (f"{netdev} MTU is {mtu}; {RECOMMENDED_MTU} is recommended for the CX-7 link — fix: "
            f"`sudo ip link set {netdev} mtu {RECOMMENDED_MTU}` on every node, and `mtu: {RECOMMENDED_MTU}` under "
            f"{netdev} in its netplan file to keep it")


def fabric_envs(facts: dict[str, FabricFacts]) -> dict[str, dict[str, str]]:
    """``build_plan(fabric_env=...)``'s argument."""
    return {name: f.env() for name, f in facts.items()}


def fabric_env_records(facts: dict[str, FabricFacts]) -> dict[str, FabricEnv]:
    """Every node's :class:`FabricEnv` (the env, what stays unset, the rule, the warnings)."""
    return {name: f.fabric_env() for name, f in facts.items()}


@dataclass(frozen=True)
class Mismatch:
    """One fabric fact that differs between nodes: what, and each node's value."""

    what: str  # "MTU", "link rate", "HCA set"
    values: dict[str, str]

    def message(self) -> str:
        shown = ", ".join(f"{n} {v}" for n, v in self.values.items())
        fix = {
            "MTU": f" — fix: the same MTU ({RECOMMENDED_MTU}) on every node's CX-7 netdevs",
            "link rate": " — fix: check the cable and both ports (`ibstat`); a slower port caps both ranks",
            "HCA set": " — fix: the same CX-7 layout on every node (both twins addressed, or neither)",
        }.get(self.what, "")
        return f"{self.what} differs between nodes: {shown}{fix}"


def compare_nodes(facts: dict[str, FabricFacts]) -> list[Mismatch]:
    """MTU, link rate and the HCA set side by side across nodes: what differs (nothing for one node)."""
    if len(facts) < 2:
        return []

    def side(values: dict[str, str], what: str) -> list[Mismatch]:
        return [Mismatch(what, values)] if len(set(values.values())) > 1 else []

    mtu = {n: ",".join(sorted({str(m) for m in (f.mtus or {"": f.mtu}).values()})) for n, f in facts.items()}
    rate = {n: ",".join(sorted({r or "unknown" for r in f.rates.values()})) or "unknown" for n, f in facts.items()}
    hca_set = {n: ",".join(f.hcas) for n, f in facts.items()}
    return side(mtu, "MTU") + side(rate, "link rate") + side(hca_set, "HCA set")
