"""What `sparkserve setup` would change on the fabric, decided from every node's discovery (pure).

Input: each node's facts (:class:`NodeFacts`, made from the read-only node program's answer with the one sysfs
reader, :func:`sparkserve.plan.fabric_sysfs.parse_sysfs`). Output: a :class:`FabricPlan` — which ConnectX-7
port is cabled to which peer, which has no link (and which cable to check), the address each cabled port gets
(one /24 per twin, the playbooks' kind: ``connect-two-sparks`` gives ``enp1s0f1np1`` 192.168.100.x/24 and its
twin ``enP2p1s0f1np1`` 192.168.101.x/24; both twins in one subnet confuse routing and NCCL, eugr
``docs/NETWORKING.md``), MTU 9000, the addresses that differ from what a port already holds (a diff, refused
without ``--force``), and the netplan file of sparkserve's own.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from sparkserve.plan.fabric_sysfs import SysfsFacts, parse_sysfs

FABRIC_MTU = 9000
DEFAULT_RANGE = "192.168.100.0/22"  # four /24s: 192.168.100.0/24 … 192.168.103.0/24 (the playbook's first two)
# a ConnectX-7 netdev on a Spark: enp1s0f1np1 and its PCIe twin enP2p1s0f1np1 (second QSFP port: …f0np0)
CX7_NAME = re.compile(r"^en(?:p|P\d+p)\d+s\d+f(?P<fn>\d+)np\d+$")


@dataclass(frozen=True)
class PortFacts:
    name: str
    mac: str
    link: bool  # carrier
    speed_mbps: int | None
    mtu: int | None
    ipv4: tuple[str, ...]  # "a.b.c.d/len"
    ipv6_ll: tuple[str, ...]
    rdma: str  # the RDMA device whose netdev this is ("" when none)
    gids: tuple[str, ...]  # that device's port-1 GIDs ("index gid type")
    peers: tuple[str, ...]  # the MACs that answered on this port (its link-local probe)


@dataclass(frozen=True)
class NodeFacts:
    """One node's discovery, typed (the node program's raw answer stays in ``raw`` for --json)."""

    name: str
    host: str
    ports: dict[str, PortFacts]
    other_ipv4: tuple[str, ...]  # addresses on every other interface (the clash check)
    raw: dict  # type: ignore[type-arg]


def node_facts(name: str, host: str, raw: dict) -> NodeFacts:  # type: ignore[type-arg]
    """The node program's answer → :class:`NodeFacts` (ConnectX-7 ports only: by RDMA device, else by name)."""
    sysfs: SysfsFacts = parse_sysfs(raw.get("sysfs", {}))
    rdma_of = {nd: hca.name for hca in sysfs.hcas.values() for nd in hca.netdevs}
    ports: dict[str, PortFacts] = {}
    other: list[str] = []
    addrs = raw.get("ports", {})
    for nd in sysfs.netdevs.values():
        a = addrs.get(nd.name, {})
        if nd.name not in rdma_of and not CX7_NAME.match(nd.name):
            other.extend(a.get("ipv4", []))
            continue
        hca = sysfs.hcas.get(rdma_of.get(nd.name, ""))
        gids: tuple[str, ...] = ()
        if hca is not None and 1 in hca.ports:
            gids = tuple(f"{g.index} {g.gid} {g.type}".strip() for g in hca.ports[1].gids)
        ports[nd.name] = PortFacts(nd.name, nd.address, bool(nd.carrier), nd.speed, nd.mtu,
                                   tuple(a.get("ipv4", [])), tuple(a.get("ipv6_ll", [])), hca.name if hca else "",
                                   gids, tuple(raw.get("peers", {}).get(nd.name, [])))
    return NodeFacts(name, host, dict(sorted(ports.items(), key=lambda kv: port_order(kv[0]))), tuple(other), raw)


def port_order(name: str) -> tuple[int, int, str]:
    """enp1s0f1np1, enP2p1s0f1np1, enp1s0f0np0, enP2p1s0f0np0: the playbook's port first, each twin after it."""
    m = CX7_NAME.match(name)
    fn = int(m.group("fn")) if m else 9
    return (-fn, 1 if "P" in name[:4] else 0, name)


def qsfp_hint(name: str) -> str:
    """Which physical cage a netdev belongs to, for the cable to check."""
    m = CX7_NAME.match(name)
    if not m:
        return name
    return f"QSFP port {2 - int(m.group('fn'))} ({'the PCIe twin of ' if 'P' in name[:4] else ''}" \
           f"{'enp1s0f' + m.group('fn') + 'np' + m.group('fn')})"


@dataclass
class PortChange:
    node: str
    port: str
    address: str  # the address it gets, "a.b.c.d/24"
    remove: list[str] = field(default_factory=list)  # addresses it holds now that differ (removed with --force)
    mtu_from: int | None = None

    @property
    def noop(self) -> bool:
        return not self.remove and self.mtu_from == FABRIC_MTU and self.address_present

    address_present: bool = False


@dataclass
class FabricPlan:
    links: list[tuple[str, str, str, str]]  # (node, port, peer node, peer port)
    unlinked: list[tuple[str, str, str]]  # (node, port, hint): no carrier, or nobody answered
    changes: list[PortChange]
    conflicts: list[str]  # diff lines: addresses already set differently
    interface: str  # the one fabric.interface (the first cabled port without a capital P)
    hca: str  # the RDMA devices of the cabled ports, comma-separated ("auto" when none is known)
    fabric_ip: dict[str, str]  # node → its address on `interface`
    errors: list[str]

    def for_node(self, node: str) -> list[PortChange]:
        return [c for c in self.changes if c.node == node]


def _peer_map(nodes: list[NodeFacts]) -> dict[str, tuple[str, str]]:
    return {p.mac: (n.name, p.name) for n in nodes for p in n.ports.values() if p.mac}


def plan_fabric(nodes: list[NodeFacts], *, address_range: str = DEFAULT_RANGE, host_base: int = 10) -> FabricPlan:
    """The fabric plan for these nodes (head first)."""
    who = _peer_map(nodes)
    links: list[tuple[str, str, str, str]] = []
    unlinked: list[tuple[str, str, str]] = []
    cabled: dict[str, list[str]] = {}  # port name → nodes where it is cabled to another discovered node
    for n in nodes:
        for p in n.ports.values():
            peers = sorted({who[a] for a in p.peers if a in who and who[a][0] != n.name})
            if not p.link:
                unlinked.append((n.name, p.name, f"no link on {p.name}: check the cable in {qsfp_hint(p.name)}"))
                continue
            if not peers:
                unlinked.append((n.name, p.name, f"{p.name} has a link but no other node answered on it: is the "
                                 f"cable's other end in one of these nodes?"))
                continue
            links.extend((n.name, p.name, pn, pp) for pn, pp in peers)
            cabled.setdefault(p.name, []).append(n.name)
    errors: list[str] = []
    # a port name counts when every node has it cabled (the playbook: "same physical port on each device")
    names = [name for name in sorted(cabled, key=port_order) if len(cabled[name]) == len(nodes)]
    if not names and len(nodes) > 1:
        errors.append("no ConnectX-7 port is cabled on every node: " + (
            "; ".join(h for _, _, h in unlinked) or "no ConnectX-7 port found"))
    try:
        rng = ipaddress.ip_network(address_range, strict=False)
    except ValueError:
        return FabricPlan(links, unlinked, [], [], "", "auto", {}, [f"{address_range!r} is not a network"])
    if rng.prefixlen > 24:
        errors.append(f"{address_range}: needs room for one /24 per twin (a /24 or larger)")
        return FabricPlan(links, unlinked, [], [], "", "auto", {}, errors)
    in_use = [ipaddress.ip_interface(a).network for n in nodes for a in n.other_ipv4]
    changes: list[PortChange] = []
    conflicts: list[str] = []
    taken: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for name in names:
        ifaces = {n.name: [ipaddress.ip_interface(a) for a in n.ports[name].ipv4] for n in nodes}
        # kept: every node's port already holds one address in one /24 of the range, hosts distinct
        nets = {i.network for v in ifaces.values() for i in v}
        keep = None
        if all(len(v) == 1 for v in ifaces.values()) and len(nets) == 1:
            net = next(iter(nets))
            if net.prefixlen == 24 and net.subnet_of(rng) and net not in taken and not any(
                    net.overlaps(u) for u in in_use) and len({v[0].ip for v in ifaces.values()}) == len(nodes):
                keep = net
        if keep is None:
            others = in_use + taken + [i.network for nm, v in (
                (x, n.ports[x].ipv4) for n in nodes for x in n.ports if x != name) for i in map(
                    ipaddress.ip_interface, v)]
            keep = next((s for s in rng.subnets(new_prefix=24) if not any(s.overlaps(o) for o in others)), None)
            if keep is None:
                errors.append(f"{address_range}: no free /24 left for {name}")
                continue
        taken.append(keep)
        for k, n in enumerate(nodes):
            have = ifaces[n.name]
            if keep is not None and len(have) == 1 and have[0].network == keep:
                addr = str(have[0])
            else:
                addr = f"{keep.network_address + host_base + k}/24"
            remove = [str(i) for i in have if str(i) != addr]
            for r in remove:
                conflicts.append(f"{n.name} {name}: - {r}  + {addr}")
            changes.append(PortChange(n.name, name, addr, remove, n.ports[name].mtu,
                                      address_present=addr in (str(i) for i in have)))
    primary = next((x for x in names if "P" not in x[:4]), names[0] if names else "")
    rdma = [n.ports[x].rdma for n in nodes[:1] for x in names if n.ports[x].rdma]
    fabric_ip = {c.node: c.address.split("/")[0] for c in changes if c.port == primary}
    return FabricPlan(links, unlinked, changes, conflicts, primary, ",".join(rdma) if rdma else "auto", fabric_ip,
                      errors)


def netplan_yaml(changes: list[PortChange]) -> str:
    """The netplan file of sparkserve's own for one node's cabled ports (``/etc/netplan/60-sparkserve-fabric.yaml``)."""
    lines = ["# written by `sparkserve setup`; `sparkserve setup --undo` removes it", "network:", "  version: 2",
             "  ethernets:"]
    for c in changes:
        lines += [f"    {c.port}:", "      dhcp4: false", "      dhcp6: false", f"      mtu: {FABRIC_MTU}",
                  f"      addresses: [{c.address}]"]
    return "\n".join(lines) + "\n"


SWAPPINESS = 1  # doctor's host check: vm.swappiness 0..10 (swapping unified memory wedges a GB10 under load)


def sysctl_text(swappiness: str) -> str:
    """The sysctl lines of sparkserve's own, or "" when the node already has what doctor asks for."""
    if swappiness.isdigit() and int(swappiness) <= 10:
        return ""
    return ("# written by `sparkserve setup` (doctor's swappiness check); `sparkserve setup --undo` removes it\n"
            f"vm.swappiness = {SWAPPINESS}\n")
