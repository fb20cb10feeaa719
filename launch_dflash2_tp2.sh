#!/usr/bin/env bash
# launch_dflash2_tp2.sh: start the DFlash2 speculative-decoding vLLM stack on every node with one command.
# Rendered by `sparkserve render --launcher` from templates/launch_dflash2_tp2.sh.j2. Do not edit: change
# the config and render again (a test fails when this file and its render differ).
#
# Run on the head node (spark-a): followers start first over ssh, then the head (API server).
#   ./launch_dflash2_tp2.sh                                 GRAPHS=1 (default): CUDA graphs FULL_AND_PIECEWISE [1, 2, 4, 8, 16, 24, 32]
#   EAGER=1 ./launch_dflash2_tp2.sh                         --enforce-eager (GRAPHS=0 means the same)
#   DRAFTER_HOST_PATH=/models/other ./launch_dflash2_tp2.sh another drafter (same path on every node)
# VLLM_API_KEY, when set here, reaches the head's API server through the environment, never an argv.
# Engine dialect (the image's flag names): 0.1.dev20051+g487ecf187 (shipped dialect data/dialects (0.1.dev20051+g487ecf187)).
# Caches: one directory per image on each node, keyed as `up` keys them (the image ID's first 12 hex).
# Fabric: fabric.interface, fabric.hca, fabric.gid_index on auto: detected on each node at run time from its sysfs by
# plan/fabric.py's own rule (python3 on every node), as `up` does; a variable the config sets is never replaced.
# DRAFTER_JSON_READER=python3|jq picks how the drafter's config.json is read (default: python3, else jq).
# Exit codes: 0 started, 2 bad input (knob, drafter), 3 a node step failed.
#
# Config fingerprints: graphs f03b56589f75041cbc4c0b7522b47b0860c29806769f6d4fff6368c532a38cbd
#                      eager  3b1a4f1a873b02539c1c65c206cc1696d76504e4b5d1367089870819a7fea8bc
set -euo pipefail

DEFAULT_DRAFTER_HOST_PATH=/models/GLM-5.3-Flash-DFlash2-G
GRAPHS="${GRAPHS:-1}"
EAGER="${EAGER:-0}"
DRAFTER_HOST_PATH="${DRAFTER_HOST_PATH:-$DEFAULT_DRAFTER_HOST_PATH}"
DRAFTER_JSON_READER="${DRAFTER_JSON_READER:-auto}"
K=7  # speculative.num_speculative_tokens

die() { printf 'error: %s\n' "$*" >&2; exit 2; }
fail() { printf 'error: %s\n' "$*" >&2; exit 3; }
say() { printf '==> %s\n' "$*" >&2; }

[[ "$GRAPHS" == 0 || "$GRAPHS" == 1 ]] || die "GRAPHS: must be 0 or 1, got '$GRAPHS'"
[[ "$EAGER" == 0 || "$EAGER" == 1 ]] || die "EAGER: must be 0 or 1, got '$EAGER'"
case "$DRAFTER_JSON_READER" in
  auto | python3 | jq) ;;
  *) die "DRAFTER_JSON_READER: must be python3, jq or auto, got '$DRAFTER_JSON_READER'" ;;
esac
if [[ "$EAGER" == 1 || "$GRAPHS" == 0 ]]; then MODE=eager; else MODE=graphs; fi

# --- the drafter: present, with its mask file, and K <= block_size - 1 -----------------------------------
case "$DRAFTER_HOST_PATH" in
  /*) ;;
  *) die "DRAFTER_HOST_PATH: '$DRAFTER_HOST_PATH' must be an absolute path (it is bind-mounted on every node)" ;;
esac
case "$DRAFTER_HOST_PATH" in
  *,* | *'"'*) die "DRAFTER_HOST_PATH: '$DRAFTER_HOST_PATH' holds a comma or a double quote (docker --mount cannot take it)" ;;
esac
[[ -d "$DRAFTER_HOST_PATH" ]] || die "DRAFTER_HOST_PATH: $DRAFTER_HOST_PATH is not a directory"
[[ -f "$DRAFTER_HOST_PATH/config.json" ]] || die "$DRAFTER_HOST_PATH/config.json: missing"
[[ -f "$DRAFTER_HOST_PATH/mask_embedding.pt" ]] ||
  die "$DRAFTER_HOST_PATH/mask_embedding.pt: missing; vLLM would silently ignore the trained mask (DO NOT SERVE)"

JSON_READER="$DRAFTER_JSON_READER"
if [[ "$JSON_READER" == auto ]]; then
  if command -v python3 >/dev/null 2>&1; then JSON_READER=python3; else JSON_READER=jq; fi
fi
command -v "$JSON_READER" >/dev/null 2>&1 || die "$JSON_READER: not installed (the launcher reads config.json with python3 or jq)"
drafter_facts() {  # drafter_facts CONFIG_JSON -> "<block_size|none> <first architecture>"
  case "$JSON_READER" in
    python3)
      python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
d = c.get("dflash_config") or {}
b = d.get("block_size", c.get("block_size"))
a = (c.get("architectures") or ["unknown"])[0]
print(b if isinstance(b, int) and not isinstance(b, bool) else "none", a)' "$1" 2>/dev/null ;;
    jq)
      jq -r '((.dflash_config.block_size // .block_size // "none") | tostring) + " " + ((.architectures // ["unknown"])[0])' "$1" 2>/dev/null ;;
  esac
}
facts="$(drafter_facts "$DRAFTER_HOST_PATH/config.json")" || die "$DRAFTER_HOST_PATH/config.json: not readable JSON"
read -r BLOCK ARCH <<<"$facts"
[[ "$BLOCK" =~ ^[0-9]+$ ]] || die "$DRAFTER_HOST_PATH/config.json: dflash_config.block_size is missing or not an integer"
if ((K != BLOCK - 1)); then
  if [[ "$ARCH" == DFlashDraftModel ]]; then
    say "warning: K=$K but the DFlash drafter's block_size is $BLOCK (the convention is K = block_size - 1)"
  elif ((K > BLOCK - 1)); then
    die "speculative K=$K but $ARCH's block_size is $BLOCK: a block drafts at most block_size - 1 = $((BLOCK - 1))"
  else
    say "warning: K=$K but $ARCH's block_size is $BLOCK: the drafter card trained and measured K = $((BLOCK - 1)); fewer boot on the SM121 image (the card: k=5, not benchmarked)"
  fi
fi

# --- nodes ------------------------------------------------------------------------------------------------
on_node() {  # on_node RANK ARGV...: run an argv on that rank's node (the head is this machine)
  local rank="$1" cmd
  shift
  case "$rank" in
    0) "$@" ;;
    1) printf -v cmd '%q ' "$@" && ssh -o BatchMode=yes -p 22 ubuntu@spark-b.lan "$cmd" ;;
    *) die "no rank $rank" ;;
  esac
}

node_name() {
  case "$1" in
    0) echo spark-a ;;
    1) echo spark-b ;;
  esac
}

container_name() {
  case "$1" in
    0) echo sparkserve-r0-spark-a ;;
    1) echo sparkserve-r1-spark-b ;;
  esac
}

cache_dirs() {  # cache_dirs RANK: DIRS = that node's cache dirs (its image key placed)
  case "$1" in
    0) DIRS=(/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@ /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/vllm /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/flashinfer /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/tilelang /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/triton /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/deep_gemm) ;;
    1) DIRS=(/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@ /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/vllm /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/flashinfer /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/tilelang /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/triton /home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/deep_gemm) ;;
  esac
  DIRS=("${DIRS[@]//@@SPARKSERVE_IMAGE_KEY@@/${KEYS[$1]}}")
}

image_key() {  # image_key RANK: the first 12 hex of the image ID on that node (`up` keys the caches the same way)
  local id
  id="$(on_node "$1" docker image inspect -f '{{.Id}}' ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e)" ||
    fail "$(node_name "$1"): docker image inspect ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e failed (is the image on that node?)"
  id="${id#sha256:}"
  [[ "$id" =~ ^[0-9a-f]{12} ]] || fail "$(node_name "$1"): docker image inspect gave '$id', not an image ID"
  KEYS[$1]="${id:0:12}"
}

FABRIC_PROGRAM="$(cat <<'SPARKSERVE_FABRIC_PROGRAM'
from __future__ import annotations

"""A node's ConnectX-7 sysfs, typed: the probe's file contents (``class/net``, ``class/infiniband``: netdevs,
RDMA devices, their ports and GID tables) → :class:`SysfsFacts`, the input of
:func:`sparkserve.plan.fabric.resolve`.

Pure: :func:`parse_sysfs` only reads the dict it is given, tested on fixture trees. The files are read on the
node by the pre-flight probe (:mod:`sparkserve.deploy.probe`), or, for the launcher, by
:func:`sparkserve.plan.fabric_node.node_read_sysfs`. Standard library only: this source ships to the nodes
with plan/fabric.py's (:func:`sparkserve.plan.fabric_node.program`).
"""


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


import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING


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


if __name__ == "__main__":
    _node_main()
SPARKSERVE_FABRIC_PROGRAM
)"

fabric_env() {  # fabric_env RANK: FABRIC[RANK] = the fabric variables detected on that node, one NAME=value a line
  local args out rc line name
  local -a protected
  case "$1" in
    0) args='{"node":"spark-a","fabric_ip":"192.168.200.1","sysfs":"/sys","interface":"auto","hca":"auto","gid_index":"auto"}' protected=(DG_JIT_CACHE_DIR FLASHINFER_CUDA_ARCH_LIST FLASHINFER_DISABLE_VERSION_CHECK HF_HOME HF_HUB_OFFLINE NCCL_BLOCKING_WAIT NCCL_CROSS_NIC NCCL_CUMEM_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_IB_ADDR_FAMILY NCCL_IB_DISABLE NCCL_IB_MERGE_NICS NCCL_IB_ROCE_VERSION_NUM NCCL_IGNORE_CPU_AFFINITY NCCL_NET NCCL_NVLS_ENABLE PYTORCH_CUDA_ALLOC_CONF TORCH_CUDA_ARCH_LIST TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_DISABLE_WATCHDOG TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TRANSFORMERS_OFFLINE VLLM_ENGINE_READY_TIMEOUT_S VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS VLLM_HOST_IP VLLM_USE_BREAKABLE_CUDAGRAPH) ;;
    1) args='{"node":"spark-b","fabric_ip":"192.168.200.2","sysfs":"/sys","interface":"auto","hca":"auto","gid_index":"auto"}' protected=(DG_JIT_CACHE_DIR FLASHINFER_CUDA_ARCH_LIST FLASHINFER_DISABLE_VERSION_CHECK HF_HOME HF_HUB_OFFLINE NCCL_BLOCKING_WAIT NCCL_CROSS_NIC NCCL_CUMEM_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_IB_ADDR_FAMILY NCCL_IB_DISABLE NCCL_IB_MERGE_NICS NCCL_IB_ROCE_VERSION_NUM NCCL_IGNORE_CPU_AFFINITY NCCL_NET NCCL_NVLS_ENABLE PYTORCH_CUDA_ALLOC_CONF TORCH_CUDA_ARCH_LIST TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_DISABLE_WATCHDOG TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TRANSFORMERS_OFFLINE VLLM_ENGINE_READY_TIMEOUT_S VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS VLLM_HOST_IP VLLM_USE_BREAKABLE_CUDAGRAPH) ;;
  esac
  rc=0
  out="$(on_node "$1" python3 -c "$FABRIC_PROGRAM" "$args")" || rc=$?
  ((rc != 127)) || fail "$(node_name "$1"): python3 not found there (it detects fabric.interface, fabric.hca, fabric.gid_index; or set them in the config)"
  ((rc == 0)) || fail "$(node_name "$1"): fabric detection failed (exit $rc)"
  FABRIC[$1]=""
  while IFS= read -r line; do
    name="${line%%=*}"
    [[ -n "$line" && " ${protected[*]} " != *" $name "* ]] || continue
    FABRIC[$1]+="$line"$'\n'
  done <<<"$out"
}

apply_fabric() {  # apply_fabric RANK: ARGV gets that node's detected variables (a rendered one of the same name is replaced)
  local kv i found
  while IFS= read -r kv; do
    [[ -n "$kv" ]] || continue
    found=0
    for i in "${!ARGV[@]}"; do
      if ((i > 0)) && [[ "${ARGV[i - 1]}" == -e && "${ARGV[i]}" == "${kv%%=*}="* ]]; then
        ARGV[i]="$kv"
        found=1
      fi
    done
    ((found)) || ARGV=("${ARGV[@]:0:2}" -e "$kv" "${ARGV[@]:2}")
  done <<<"${FABRIC[$1]}"
}

node_argv() {  # node_argv RANK: ARGV = that rank's `docker run` for $MODE (from the sparkserve plan)
  case "$1:$MODE" in
    0:graphs)
      ARGV=(
        docker run
        -d
        --name sparkserve-r0-spark-a
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=f03b56589f75041cbc4c0b7522b47b0860c29806769f6d4fff6368c532a38cbd
        --label io.sparkserve.node=spark-a
        --label io.sparkserve.rank=0
        --label io.sparkserve.role=head
        --network=host
        --ipc=host
        --shm-size 32g
        --memory 118g
        --ulimit memlock=-1:-1
        --ulimit core=0:0
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3600
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_CROSS_NIC=0
        -e NCCL_IB_MERGE_NICS=0
        -e NCCL_BLOCKING_WAIT=0
        -e TORCH_NCCL_ASYNC_ERROR_HANDLING=1
        -e TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1800
        -e TORCH_NCCL_DISABLE_WATCHDOG=1
        -e HF_HOME=/cache/huggingface
        -e DG_JIT_CACHE_DIR=/root/.deep_gemm
        -e NCCL_DEBUG=INFO
        -e 'NCCL_DEBUG_SUBSYS=INIT,NET'
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e TORCH_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_DISABLE_VERSION_CHECK=1
        -e VLLM_HOST_IP=192.168.200.1
        -e NCCL_NET=IB
        -e NCCL_IB_ROCE_VERSION_NUM=2
        -e NCCL_IB_ADDR_FAMILY=AF_INET
        -e NCCL_IB_ADDR_RANGE=192.168.200.0/24
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@,target=/cache'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/tilelang,target=/root/.tilelang'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/triton,target=/root/.triton'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/deep_gemm,target=/root/.deep_gemm'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --trust-remote-code
        --tensor-parallel-size 2
        --enable-expert-parallel
        --gpu-memory-utilization 0.795
        --max-model-len 262144
        --max-num-seqs 6
        --block-size 2304
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --kv-cache-dtype fp8_e4m3
        --kv-cache-memory 8053063680
        --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,24,32]}'
        --tool-call-parser glm47
        --enable-auto-tool-choice
        --reasoning-parser glm45
        --default-chat-template-kwargs '{"enable_thinking":true}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 0
        --master-addr 192.168.200.1
        --master-port 29521
        --port 8000
      ) ;;
    0:eager)
      ARGV=(
        docker run
        -d
        --name sparkserve-r0-spark-a
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=3b1a4f1a873b02539c1c65c206cc1696d76504e4b5d1367089870819a7fea8bc
        --label io.sparkserve.node=spark-a
        --label io.sparkserve.rank=0
        --label io.sparkserve.role=head
        --network=host
        --ipc=host
        --shm-size 32g
        --memory 118g
        --ulimit memlock=-1:-1
        --ulimit core=0:0
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3600
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_CROSS_NIC=0
        -e NCCL_IB_MERGE_NICS=0
        -e NCCL_BLOCKING_WAIT=0
        -e TORCH_NCCL_ASYNC_ERROR_HANDLING=1
        -e TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1800
        -e TORCH_NCCL_DISABLE_WATCHDOG=1
        -e HF_HOME=/cache/huggingface
        -e DG_JIT_CACHE_DIR=/root/.deep_gemm
        -e NCCL_DEBUG=INFO
        -e 'NCCL_DEBUG_SUBSYS=INIT,NET'
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e TORCH_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_DISABLE_VERSION_CHECK=1
        -e VLLM_HOST_IP=192.168.200.1
        -e NCCL_NET=IB
        -e NCCL_IB_ROCE_VERSION_NUM=2
        -e NCCL_IB_ADDR_FAMILY=AF_INET
        -e NCCL_IB_ADDR_RANGE=192.168.200.0/24
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@,target=/cache'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/tilelang,target=/root/.tilelang'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/triton,target=/root/.triton'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/deep_gemm,target=/root/.deep_gemm'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --trust-remote-code
        --tensor-parallel-size 2
        --enable-expert-parallel
        --gpu-memory-utilization 0.795
        --max-model-len 262144
        --max-num-seqs 6
        --block-size 2304
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --kv-cache-dtype fp8_e4m3
        --kv-cache-memory 8053063680
        --enforce-eager
        --tool-call-parser glm47
        --enable-auto-tool-choice
        --reasoning-parser glm45
        --default-chat-template-kwargs '{"enable_thinking":true}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 0
        --master-addr 192.168.200.1
        --master-port 29521
        --port 8000
      ) ;;
    1:graphs)
      ARGV=(
        docker run
        -d
        --name sparkserve-r1-spark-b
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=f03b56589f75041cbc4c0b7522b47b0860c29806769f6d4fff6368c532a38cbd
        --label io.sparkserve.node=spark-b
        --label io.sparkserve.rank=1
        --label io.sparkserve.role=follower
        --network=host
        --ipc=host
        --shm-size 32g
        --memory 118g
        --ulimit memlock=-1:-1
        --ulimit core=0:0
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3600
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_CROSS_NIC=0
        -e NCCL_IB_MERGE_NICS=0
        -e NCCL_BLOCKING_WAIT=0
        -e TORCH_NCCL_ASYNC_ERROR_HANDLING=1
        -e TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1800
        -e TORCH_NCCL_DISABLE_WATCHDOG=1
        -e HF_HOME=/cache/huggingface
        -e DG_JIT_CACHE_DIR=/root/.deep_gemm
        -e NCCL_DEBUG=INFO
        -e 'NCCL_DEBUG_SUBSYS=INIT,NET'
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e TORCH_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_DISABLE_VERSION_CHECK=1
        -e VLLM_HOST_IP=192.168.200.2
        -e NCCL_NET=IB
        -e NCCL_IB_ROCE_VERSION_NUM=2
        -e NCCL_IB_ADDR_FAMILY=AF_INET
        -e NCCL_IB_ADDR_RANGE=192.168.200.0/24
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@,target=/cache'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/tilelang,target=/root/.tilelang'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/triton,target=/root/.triton'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/deep_gemm,target=/root/.deep_gemm'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --trust-remote-code
        --tensor-parallel-size 2
        --enable-expert-parallel
        --gpu-memory-utilization 0.795
        --max-model-len 262144
        --max-num-seqs 6
        --block-size 2304
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --kv-cache-dtype fp8_e4m3
        --kv-cache-memory 8053063680
        --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,24,32]}'
        --tool-call-parser glm47
        --enable-auto-tool-choice
        --reasoning-parser glm45
        --default-chat-template-kwargs '{"enable_thinking":true}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 1
        --master-addr 192.168.200.1
        --master-port 29521
        --headless
      ) ;;
    1:eager)
      ARGV=(
        docker run
        -d
        --name sparkserve-r1-spark-b
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=3b1a4f1a873b02539c1c65c206cc1696d76504e4b5d1367089870819a7fea8bc
        --label io.sparkserve.node=spark-b
        --label io.sparkserve.rank=1
        --label io.sparkserve.role=follower
        --network=host
        --ipc=host
        --shm-size 32g
        --memory 118g
        --ulimit memlock=-1:-1
        --ulimit core=0:0
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3600
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_CROSS_NIC=0
        -e NCCL_IB_MERGE_NICS=0
        -e NCCL_BLOCKING_WAIT=0
        -e TORCH_NCCL_ASYNC_ERROR_HANDLING=1
        -e TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1800
        -e TORCH_NCCL_DISABLE_WATCHDOG=1
        -e HF_HOME=/cache/huggingface
        -e DG_JIT_CACHE_DIR=/root/.deep_gemm
        -e NCCL_DEBUG=INFO
        -e 'NCCL_DEBUG_SUBSYS=INIT,NET'
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e TORCH_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_CUDA_ARCH_LIST=12.1a
        -e FLASHINFER_DISABLE_VERSION_CHECK=1
        -e VLLM_HOST_IP=192.168.200.2
        -e NCCL_NET=IB
        -e NCCL_IB_ROCE_VERSION_NUM=2
        -e NCCL_IB_ADDR_FAMILY=AF_INET
        -e NCCL_IB_ADDR_RANGE=192.168.200.0/24
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@,target=/cache'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/tilelang,target=/root/.tilelang'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/triton,target=/root/.triton'
        --mount 'type=bind,source=/home/ubuntu/.cache/sparkserve/@@SPARKSERVE_IMAGE_KEY@@/deep_gemm,target=/root/.deep_gemm'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --trust-remote-code
        --tensor-parallel-size 2
        --enable-expert-parallel
        --gpu-memory-utilization 0.795
        --max-model-len 262144
        --max-num-seqs 6
        --block-size 2304
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --kv-cache-dtype fp8_e4m3
        --kv-cache-memory 8053063680
        --enforce-eager
        --tool-call-parser glm47
        --enable-auto-tool-choice
        --reasoning-parser glm45
        --default-chat-template-kwargs '{"enable_thinking":true}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 1
        --master-addr 192.168.200.1
        --master-port 29521
        --headless
      ) ;;
  esac
  ARGV=("${ARGV[@]//@@SPARKSERVE_IMAGE_KEY@@/${KEYS[$1]}}")
  apply_fabric "$1"
  if [[ "$1" == 0 && -n "${VLLM_API_KEY:-}" ]]; then
    export VLLM_API_KEY
    ARGV=("${ARGV[@]:0:2}" -e VLLM_API_KEY "${ARGV[@]:2}")
  fi
}

RANKS=(0 1)
KEYS=()
FABRIC=()
START_ORDER=(1 0)  # followers first, the head last

# 1. Every node has the drafter (same path), the image, its cache dirs and its fabric.
for rank in "${RANKS[@]}"; do
  node="$(node_name "$rank")"
  on_node "$rank" test -f "$DRAFTER_HOST_PATH/mask_embedding.pt" ||
    die "$node: $DRAFTER_HOST_PATH/mask_embedding.pt is missing there (sync the drafter to every node)"
  image_key "$rank"
  cache_dirs "$rank"
  on_node "$rank" mkdir -p "${DIRS[@]}" || fail "$node: cannot create the cache dirs"
  fabric_env "$rank"
  say "$node: fabric $(tr '\n' ' ' <<<"${FABRIC[$rank]}")"
done

# 2. Remove the previous ranks everywhere before starting any (a stale rank joins the wrong rendezvous).
for rank in "${RANKS[@]}"; do
  node="$(node_name "$rank")"
  name="$(container_name "$rank")"
  if managed="$(on_node "$rank" docker container inspect -f '{{ index .Config.Labels "io.sparkserve.managed" }}' "$name" 2>/dev/null)"; then
    [[ "$managed" == 1 ]] || die "$node: a container named $name exists and is not sparkserve's; remove it yourself"
    say "$node: stopping the previous $name"
    on_node "$rank" docker stop -t 30 "$name" >/dev/null || fail "$node: docker stop $name failed"
    on_node "$rank" docker rm "$name" >/dev/null || fail "$node: docker rm $name failed"
  fi
done

# 3. Start: followers, then the head; each must be running before the next starts.
for rank in "${START_ORDER[@]}"; do
  node="$(node_name "$rank")"
  name="$(container_name "$rank")"
  node_argv "$rank"
  say "$node: starting $name ($MODE, drafter $DRAFTER_HOST_PATH)"
  on_node "$rank" "${ARGV[@]}" >/dev/null || fail "$node: docker run $name failed"
  running="$(on_node "$rank" docker container inspect -f '{{.State.Running}}' "$name")" ||
    fail "$node: cannot inspect $name"
  [[ "$running" == true ]] || fail "$node: $name is not running (docker logs $name)"
done

say "all 2 ranks started; API http://spark-a.lan:8000 once the head logs 'Application startup complete.' (docker logs -f sparkserve-r0-spark-a)"
