"""Render ``launch_dflash2_tp2.sh``: one bash command that starts every rank, from the same plan `up` uses.

The script's ``docker run`` argvs are ``ContainerSpec.docker_run_argv()`` of two plans — graphs (the
config as ruled) and eager (``serve.enforce_eager``) — quoted for bash here and laid out by the jinja2
template; the drafter mount's source becomes ``${DRAFTER_HOST_PATH}`` so it can be overridden at run time.
Nothing in the template builds an argv of its own.

What only the nodes know is filled in at run time, by the rules ``up`` applies:

* the fabric left on ``auto`` (interface, HCA(s), GID per the dual-rail rule, the detected address range):
  each node runs :func:`sparkserve.plan.fabric_node.program` — plan/fabric_sysfs.py's and plan/fabric.py's own
  source — on its sysfs, and its ``NAME=value`` lines become ``-e`` items of that rank's ``docker run`` (never
  over a variable the config sets). A fabric_ip that is not IPv4 cannot be detected (RoCE v2 IPv4 GIDs):
  rendering refuses then while ``fabric.interface``/``hca``/``gid_index`` are ``auto``;
* the cache directory's image key: the first 12 hex of the image ID on that node (``up``'s key), in place
  of the render-time ``ref-…`` key.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from sparkserve.config import Config
from sparkserve.errors import BadInput
from sparkserve.plan.build import build_plan, cache_dirs
from sparkserve.plan.container import LABEL_MANAGED, ContainerSpec
from sparkserve.plan.fabric_node import PROGRAM_DELIMITER, program
from sparkserve.plan.mounts import DRAFTER_MOUNT, image_key
from sparkserve.plan.rank_env import node_env

LAUNCHER_NAME = "launch_dflash2_tp2.sh"
TEMPLATE = LAUNCHER_NAME + ".j2"
DRAFTER_VAR = "DRAFTER_HOST_PATH"
_SENTINEL = "/@@SPARKSERVE_DRAFTER_HOST_PATH@@"
IMAGE_KEY_SENTINEL = "@@SPARKSERVE_IMAGE_KEY@@"  # replaced by each node's image key at run time
FABRIC_AUTO = ("interface", "hca", "gid_index")


def templates_dir() -> Path:
    """templates/ shipped inside the wheel (sparkserve/templates), else the source tree's templates/."""
    shipped = resources.files("sparkserve").joinpath("templates")
    if shipped.is_dir():
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "templates"


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def sh_word(arg: str) -> str:
    """Quote one argv element for bash; the drafter-path sentinel becomes ``${DRAFTER_HOST_PATH}``."""
    if _SENTINEL not in arg:
        quoted = shlex.quote(arg)
        # commas are docker's (--mount CSV); quoting them tells shellcheck they are not array separators
        return f"'{arg}'" if quoted == arg and "," in arg else quoted
    parts = [p.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
             for p in arg.split(_SENTINEL)]
    return '"' + ("${" + DRAFTER_VAR + "}").join(parts) + '"'


def argv_lines(argv: list[str]) -> list[str]:
    """Bash-quoted argv, one option (with its values) per line; everything after the image on one line
    per flag as well."""
    lines: list[str] = []
    for a in argv:
        w = sh_word(a)
        if not lines or (a.startswith("-") and len(a) > 1):
            lines.append(w)
        else:
            lines[-1] += " " + w
    return lines


def _variant(cfg: Config, *, eager: bool) -> Config:
    c = cfg.model_copy(deep=True)
    c.serve.enforce_eager = eager
    return c


def _image_split(spec: ContainerSpec) -> tuple[list[str], list[str]]:
    """(docker run options up to and including the image, the command after it)."""
    argv = spec.docker_run_argv()
    i = argv.index("--entrypoint") + 2  # --entrypoint X IMAGE
    return argv[: i + 1], argv[i + 1:]


def fabric_auto(cfg: Config) -> list[str]:
    """The fabric fields left on ``auto`` (detected on each node at run time)."""
    return [f"fabric.{k}" for k in FABRIC_AUTO if getattr(cfg.fabric, k) == "auto"]


def _check_detectable(cfg: Config) -> None:
    auto = fabric_auto(cfg)
    if not auto:
        return
    for i, n in enumerate(cfg.nodes):
        if ipaddress.ip_address(n.fabric_ip).version != 4:
            raise BadInput(auto[0], f"auto cannot be detected for {n.name} (nodes.{i}.fabric_ip {n.fabric_ip} is not "
                           "IPv4; detection finds its RoCE v2 IPv4 GID): set fabric.interface, fabric.hca and "
                           "fabric.gid_index for the launcher")


def _detect_args(cfg: Config, rank: int) -> str:
    node = cfg.nodes[rank]
    f = cfg.fabric
    return json.dumps({"node": node.name, "fabric_ip": node.fabric_ip, "sysfs": str(f.sysfs_root),
                       "interface": f.interface, "hca": f.hca, "gid_index": f.gid_index}, separators=(",", ":"))


def _protected(cfg: Config, rank: int) -> list[str]:
    """The variables detection never replaces on this rank: every one the config sets (``up``'s rule in
    plan/rank_env.node_env), but for the render-time address range when fabric.addr_range is auto."""
    env = node_env(cfg, cfg.nodes[rank], None)
    if cfg.fabric.addr_range == "auto":
        env.pop("NCCL_IB_ADDR_RANGE", None)
    return sorted(env)


def launcher_context(cfg: Config) -> dict[str, Any]:
    if cfg.serve.executor != "mp":
        raise BadInput("serve.executor", f"{LAUNCHER_NAME} starts vLLM's native multi-node (mp) ranks; "
                       "use `sparkserve up` for ray")
    if cfg.runtime != "docker":
        raise BadInput("runtime", f"{LAUNCHER_NAME} starts docker containers; runtime: process runs with `sparkserve "
                       "up`")
    if cfg.drafter is None or cfg.speculative.method != "dflash":
        raise BadInput("speculative.method", f"{LAUNCHER_NAME} serves a DFlash drafter (its checks are the "
                       "drafter's); the MTP head runs with `sparkserve up`")
    _check_detectable(cfg)
    variants = {}
    for mode, eager in (("graphs", False), ("eager", True)):
        real = _variant(cfg, eager=eager)
        fp = real.fingerprint()
        shown = real.model_copy(deep=True)
        shown.drafter.path = Path(_SENTINEL)
        variants[mode] = (fp, build_plan(shown, fingerprint=fp, cache_key=IMAGE_KEY_SENTINEL))
    detect = bool(fabric_auto(cfg))
    nodes = []
    for rank, node in enumerate(cfg.nodes):
        specs = {mode: plan.specs[rank] for mode, (_fp, plan) in variants.items()}
        argv = {}
        for mode, spec in specs.items():
            opts, cmd = _image_split(spec)
            argv[mode] = argv_lines(opts[:-1]) + [sh_word(opts[-1])] + argv_lines(cmd)
        ssh = None
        if rank:
            ssh = ["ssh", "-o", "BatchMode=yes", "-p", str(node.port), f"{node.user}@{node.host}"]
        nodes.append({
            "rank": rank,
            "name": node.name,
            "role": "head" if rank == 0 else "follower",
            "container": specs["graphs"].name,
            "ssh": " ".join(shlex.quote(a) for a in ssh) if ssh else None,
            "argv": argv,
            "cache_dirs": " ".join(sh_word(d) for d in cache_dirs(variants["graphs"][1])[node.name]),
            "detect_args": shlex.quote(_detect_args(cfg, rank)) if detect else None,
            "protected": " ".join(_protected(cfg, rank)) if detect else "",
        })
    c = cfg.serve.compilation
    plan = variants["graphs"][1]
    return {
        "launcher": LAUNCHER_NAME,
        "template": TEMPLATE,
        "drafter_var": DRAFTER_VAR,
        "drafter_default": shlex.quote(str(cfg.drafter.path)),
        "drafter_mount": DRAFTER_MOUNT,
        "k": cfg.speculative.num_speculative_tokens,
        "default_mode": "eager" if cfg.serve.enforce_eager else "graphs",
        "graphs_desc": f"{c.cudagraph_mode.value} {c.cudagraph_capture_sizes}",
        "fingerprints": {mode: fp for mode, (fp, _plan) in variants.items()},
        "inspect_label_format": shlex.quote(f'{{{{ index .Config.Labels "{LABEL_MANAGED}" }}}}'),
        "inspect_running_format": shlex.quote("{{.State.Running}}"),
        "inspect_id_format": shlex.quote("{{.Id}}"),
        "image": shlex.quote(cfg.image.ref),
        "image_key_sentinel": IMAGE_KEY_SENTINEL,
        "render_key": image_key(cfg, None),
        "dialect": f"{plan.dialect} ({plan.dialect_source})",
        "stop_timeout": cfg.container.stop_timeout_s,
        "api_url": plan.api_url,
        "literal_dollar": any("$" in line.replace("${" + DRAFTER_VAR + "}", "")
                              for n in nodes for lines in n["argv"].values() for line in lines),
        "detect": detect,
        "fabric_auto": ", ".join(fabric_auto(cfg)),
        "fabric_program": program() if detect else "",
        "fabric_delimiter": PROGRAM_DELIMITER,
        "nodes": nodes,
        "head": nodes[0],
        "followers": nodes[1:],
    }


def render_launcher(cfg: Config) -> str:
    """The launcher script for this config (the committed one is this with the embedded default)."""
    return environment().get_template(TEMPLATE).render(**launcher_context(cfg))
