"""`sparkserve bundle`: one tar.gz to attach to a bug report.

What goes in (each part best effort: a part that cannot be had is named in ``errors.json`` with why, and
the bundle is still written): the config file with its secrets redacted, the plan, `doctor --json`,
`gates --json` (the smoke cell skipped: a bundle never loads the stack), the image facts of every node and
the image lock, the drafter's manifest and the target's file list on the head, each node's host facts, the
versions (sparkserve, vLLM, the image), the journal's tail, and the last saved logs of every rank.

Secrets never leave the machine: every value under a key that names a secret (api key, token, password,
secret, credential), every secret part of each alert URL (plan/alert_urls.py) and the API key sparkserve would
send are collected first, and *every* member of the
tarball is scrubbed of each of them, whatever part it came from. ``redact_hosts`` also replaces every node's
host name and address, and every other IPv4 address, with a stable placeholder (``host-1``, ``ip-1``, …).

    path, errors = write_bundle(cfg, nodes, unreachable, config_file=Path("sparkserve.yaml"), out=Path("b.tgz"))
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkserve import __version__
from sparkserve.config import Config, resolve_api_key
from sparkserve.errors import SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.plan.alert_urls import url_secrets

REDACTED = "<redacted>"
#: A key whose value is a secret, wherever it is in the config (or serve.env).
SECRET_KEY = re.compile(r"api[_-]?key|(?:^|[_.-])(?:token|auth|authorization)$|passw(?:or)?d|secret|credential"
                        r"|private[_-]?key", re.IGNORECASE)  # HF_TOKEN, auth_token; never pool_tokens, mask_token_id
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
JOURNAL_TAIL = 50


@dataclass
class Bundle:
    """The members of a bundle before they are written (name → text) and the parts that failed."""

    files: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def part(self, name: str, make: Callable[[], Any]) -> None:
        """Add ``name`` from ``make()`` (text, or JSON data); a failure is recorded, never raised."""
        try:
            value = make()
        except KeyboardInterrupt:
            raise
        except SparkserveError as e:
            self.errors[name] = e.line()
            return
        except Exception as e:  # noqa: BLE001 - a bundle part that fails is named in errors.json, not fatal
            self.errors[name] = f"{type(e).__name__}: {e}"
            return
        if value is None:
            return
        self.files[name] = value if isinstance(value, str) else json.dumps(value, indent=2, default=str) + "\n"


# -- secrets and hosts ----------------------------------------------------------------------------------


def secret_values(data: Any, cfg: Config | None) -> set[str]:
    """Every value in ``data`` (the config file's YAML) under a secret-looking key, every secret part of each
    ``supervise.alert_urls`` URL, and the API key."""
    found: set[str] = set()

    def walk(x: Any, key: str = "") -> None:
        if isinstance(x, Mapping):
            for k, v in x.items():
                walk(v, str(k))
        elif isinstance(x, list):
            for v in x:
                walk(v, key)
        elif x is not None and not isinstance(x, bool) and SECRET_KEY.search(key) and str(x).strip():
            found.add(str(x))

    walk(data)
    sup = data.get("supervise") if isinstance(data, Mapping) else None
    urls = list(sup.get("alert_urls") or []) if isinstance(sup, Mapping) else []
    if cfg is not None:
        urls += cfg.supervise.alert_urls
    found |= url_secrets(str(u) for u in urls)  # alert URLs: every token, password and webhook part of each
    if cfg is not None:
        try:
            key = resolve_api_key(cfg)
        except SparkserveError:
            key = None
        if key:
            found.add(key)
    return {s for s in found if len(s) >= 4}  # "true", a port: never secrets worth scrubbing everywhere


def redact_config_text(text: str) -> str:
    """The config file, each value under a secret-looking key replaced (comments and layout kept)."""
    out = []
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(\s*-?\s*)([\"']?)([A-Za-z0-9_.-]+)\2(\s*:\s*)(.*?)(\s*#.*)?(\r?\n)?$", line)
        if m and SECRET_KEY.search(m.group(3)) and m.group(5).strip():
            line = f"{m.group(1)}{m.group(2)}{m.group(3)}{m.group(2)}{m.group(4)}{REDACTED}{m.group(6) or ''}" \
                   f"{m.group(7) or ''}"
        out.append(line)
    return "".join(out)


def host_map(cfg: Config) -> dict[str, str]:
    """Each node's host name/address and fabric IP → a stable placeholder (host-1, ip-1, …)."""
    out: dict[str, str] = {}
    for i, n in enumerate(cfg.nodes, 1):
        if n.host not in out:
            out[n.host] = f"ip-host-{i}" if _IPV4.fullmatch(n.host) else f"host-{i}"
        out.setdefault(n.fabric_ip, f"ip-fabric-{i}")
    return out


def scrub(text: str, secrets: set[str], hosts: dict[str, str] | None) -> str:
    """``text`` with every secret (and, with ``hosts``, every host and IPv4 address) replaced."""
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    if hosts is not None:
        for h in sorted(hosts, key=len, reverse=True):
            text = re.sub(rf"(?<![\w.-]){re.escape(h)}(?![\w-]|\.\w)", hosts[h], text)
        others: dict[str, str] = {}

        def ip(m: re.Match[str]) -> str:
            if m.group(0).startswith("127.") or m.group(0) in ("0.0.0.0", "255.255.255.255"):
                return m.group(0)  # loopback and "all addresses" name no machine
            return others.setdefault(m.group(0), f"ip-{len(others) + 1}")

        text = _IPV4.sub(ip, text)
    return text


# -- the parts ------------------------------------------------------------------------------------------


def _plan(cfg: Config) -> Any:
    from sparkserve.plan.build import build_plan
    from sparkserve.plan.container import REDACTED as PLAN_REDACTED

    has_key = bool(cfg.serve.api_key_env or cfg.serve.api_key_file)
    return build_plan(cfg, api_key=PLAN_REDACTED if has_key else None).public()


def _lock() -> str | None:
    from sparkserve.image.context import default_recipe, lock_path_for

    path = lock_path_for(default_recipe())
    return path.read_text() if path.is_file() else None


def _versions(cfg: Config, image: Any) -> dict[str, Any]:
    import importlib.metadata
    import platform

    try:
        local_vllm: str | None = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        local_vllm = None
    facts = (image or {}).get("facts") or {}
    engine = {n: (f.get("vllm") if isinstance(f, dict) else None) for n, f in facts.items()}
    return {"sparkserve": __version__, "python": platform.python_version(), "vllm_here": local_vllm,
            "vllm_in_image": engine or None, "image_ref": cfg.image.ref,
            "image_fingerprints": (image or {}).get("fingerprints"), "runtime": cfg.runtime}


HOST_COMMANDS = (
    ("uname", ["uname", "-a"]),
    ("os-release", ["cat", "/etc/os-release"]),
    ("meminfo", ["cat", "/proc/meminfo"]),
    ("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv"]),
    ("docker", ["docker", "version", "--format", "{{.Server.Version}}"]),
    ("disk", ["df", "-h", "/"]),
)


def _host_facts(node: Node) -> str:
    out = []
    for name, argv in HOST_COMMANDS:
        try:
            res = node.run(argv, check=False, step="bundle", timeout=20)
            text = (res.stdout or "").strip() or f"(exit {res.exit_code}) {(res.stderr or '').strip()}"
        except SparkserveError as e:
            text = f"(failed) {e.line()}"
        out.append(f"## {name}: {' '.join(argv)}\n{text}\n")
    return "\n".join(out)


def _target_files(node: Node, target: str) -> str:
    res = node.run(["find", "-L", target, "-maxdepth", "1", "-printf", "%P\t%s\n"], check=False, step="bundle",
                   timeout=30)
    if res.exit_code != 0:
        raise RuntimeError((res.stderr or "").strip() or f"find exited {res.exit_code}")
    return res.stdout


def _drafter_manifest(node: Node, path: str) -> Any:
    from sparkserve.deploy.sync import remote_manifest

    st = remote_manifest(node, path, cached_only=True, step="bundle")
    return {"path": path, "exists": st.exists, "digest": None if st.uncached else st.manifest.digest,
            "uncached": st.uncached, "files": st.manifest.to_json()}


def _journal_tail() -> Any:
    from sparkserve.journal import Journal, default_path

    with Journal.open(default_path()) as j:
        return {"journal": str(default_path()), "entries": [e.as_dict() for e in j.history(JOURNAL_TAIL)]}


def collect(cfg: Config, nodes: dict[str, Node], unreachable: Mapping[str, SparkserveError], *,
            config_text: str | None, say: Callable[[str], None] = lambda _: None) -> Bundle:
    """Every part of the bundle (see the module docstring), unredacted; nothing on a node is changed
    (the gates run without their smoke cell)."""
    b = Bundle()
    for name, e in unreachable.items():
        b.errors[f"node {name}"] = e.line()
    b.part("config.yaml", lambda: redact_config_text(config_text) if config_text is not None else None)
    b.part("config-effective.json", lambda: cfg.normalized())
    b.part("plan.json", lambda: _plan(cfg))
    head = nodes.get(cfg.head.name)
    say("bundle: doctor")

    def doctor() -> Any:
        from sparkserve.deploy.doctor import as_json, check_all

        return as_json(check_all(cfg, nodes, None, check_ports=True, unreachable=unreachable))

    b.part("doctor.json", doctor)
    say("bundle: gates (no smoke cell)")

    def gates() -> Any:
        from sparkserve.deploy.gates_live import run_gates

        return run_gates(cfg, nodes, skip=("smoke",)).to_json()

    b.part("gates.json", gates)
    say("bundle: image facts, manifests, host facts")
    image: dict[str, Any] = {}

    def image_facts() -> Any:
        from sparkserve.image.verify import verify_image

        image.update(verify_image(cfg, nodes, facts=True).as_json())
        return image

    if cfg.runtime == "docker" and not unreachable:
        b.part("image.json", image_facts)
    elif cfg.runtime == "docker":
        b.errors["image.json"] = f"not every node answered ({', '.join(unreachable)}): no image comparison"
    b.part("image-lock.json", _lock)
    b.part("versions.json", lambda: _versions(cfg, image))
    if head is not None:
        b.part("drafter-manifest.json", lambda: _drafter_manifest(head, str(cfg.drafter.path)))
        b.part("target-files.tsv", lambda: _target_files(head, str(cfg.model.target)))
    for name, node in nodes.items():
        b.part(f"hosts/{name}.txt", lambda node=node: _host_facts(node))  # type: ignore[misc]
    b.part("journal.json", _journal_tail)
    say("bundle: the last saved logs")
    from sparkserve.deploy.stack import last_saved_logs

    last = last_saved_logs()
    if last is None:
        b.errors["logs"] = "no saved logs (`down` and a failed `up` save every rank's log)"
    else:
        for f in sorted(last.glob("*.log")):
            b.part(f"logs/{last.name}/{f.name}", lambda f=f: f.read_text(errors="replace"))  # type: ignore[misc]
    return b


def write(b: Bundle, out: Path, *, secrets: set[str], hosts: dict[str, str] | None) -> Path:
    """Write the bundle as one tar.gz, every member scrubbed (secrets; hosts and IPs with ``hosts``)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = f"sparkserve-bundle-{stamp}"
    files = dict(b.files)
    files["errors.json"] = json.dumps(b.errors, indent=2) + "\n"
    files["README.txt"] = (
        "sparkserve bundle: attach it to a bug report.\n"
        "Secrets (values under api key/token/password/secret keys, the API key) are replaced by <redacted>"
        + ("; host names and IP addresses by host-N / ip-N" if hosts is not None else "") + ".\n"
        "errors.json names every part that could not be collected, and why.\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tf:
        for name, text in sorted(files.items()):
            data = scrub(text, secrets, hosts).encode()
            info = tarfile.TarInfo(f"{root}/{scrub(name, secrets, hosts)}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tf.addfile(info, io.BytesIO(data))
    out.chmod(0o600)
    return out
