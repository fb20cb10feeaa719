"""Render ``launch_dflash2_tp2.sh``: one bash command that starts every rank, from the same plan `up` uses.

The script's ``docker run`` argvs are ``ContainerSpec.docker_run_argv()`` of two plans — graphs (the
config as ruled) and eager (``serve.enforce_eager``) — quoted for bash here and laid out by the jinja2
template; the drafter mount's source becomes ``${DRAFTER_HOST_PATH}`` so it can be overridden at run time.
Nothing in the template builds an argv of its own.
"""

from __future__ import annotations

import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from sparkserve.config import Config
from sparkserve.errors import BadInput
from sparkserve.plan.build import CACHE_MOUNTS, DRAFTER_MOUNT, build_plan
from sparkserve.plan.container import LABEL_MANAGED, ContainerSpec

LAUNCHER_NAME = "launch_dflash2_tp2.sh"
TEMPLATE = LAUNCHER_NAME + ".j2"
DRAFTER_VAR = "DRAFTER_HOST_PATH"
_SENTINEL = "/@@SPARKSERVE_DRAFTER_HOST_PATH@@"


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


def launcher_context(cfg: Config) -> dict[str, Any]:
    if cfg.serve.executor != "mp":
        raise BadInput("serve.executor", f"{LAUNCHER_NAME} starts vLLM's native multi-node (mp) ranks; "
                       "use `sparkserve up` for ray")
    variants = {}
    for mode, eager in (("graphs", False), ("eager", True)):
        real = _variant(cfg, eager=eager)
        fp = real.fingerprint()
        shown = real.model_copy(deep=True)
        shown.drafter.path = Path(_SENTINEL)
        variants[mode] = (fp, build_plan(shown, fingerprint=fp))
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
        })
    c = cfg.serve.compilation
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
        "cache_dirs": " ".join(shlex.quote(str(cfg.container.cache_root / sub)) for sub in CACHE_MOUNTS),
        "stop_timeout": cfg.container.stop_timeout_s,
        "api_url": variants["graphs"][1].api_url,
        "literal_dollar": any("$" in line.replace("${" + DRAFTER_VAR + "}", "")
                              for n in nodes for lines in n["argv"].values() for line in lines),
        "nodes": nodes,
        "head": nodes[0],
        "followers": nodes[1:],
    }


def render_launcher(cfg: Config) -> str:
    """The launcher script for this config (the committed one is this with the embedded default)."""
    return environment().get_template(TEMPLATE).render(**launcher_context(cfg))
