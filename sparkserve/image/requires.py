"""What the engine's ``vllm`` declares it needs, and whether its environment has it — before any boot.

    raw = read_requires(node, image)                   # docker: the check run in the image (no GPU, no network)
    raw = read_requires_process(node, cfg)             # process: run by the interpreter serve.vllm runs
    check = parse_requires(raw)                        # pure: RequiresCheck (None: no answer to read)
    check.missing_line("in the image")                 # the one-line headline, or None
    found = engine_requires(cfg, nodes, image_id)      # `up`: the docker answer kept per image ID

An engine installed without its declared dependencies (``pip install --no-deps``, the way fork and NGC-based
images layer a vLLM wheel over a base to keep its torch) boots through the model load and the KV profile and
only then dies at its first import of what is not there: real vLLM 0.34.0 on an H100 died at kernel warm-up
with ``ModuleNotFoundError: No module named 'cutlass'`` (its wheel requires ``nvidia-cutlass-dsl[cu13]==4.8.0``
and ``quack-kernels==0.6.5``; tests/fixtures/logs/real-0.34.0-gpu). The check is
``docker/tools/image_facts.py`` (``requires``, stdlib only; ``packaging`` for markers and specifiers when the
environment has it), run inside the engine's own environment; this module reads its JSON:

* **missing** — a distribution vLLM requires (its marker holds here; ``extra == …`` lines left out) is not
  installed: a hard finding. A requirement that names extras (``nvidia-cutlass-dsl[cu13]``) requires the
  distribution and, one level down, what that distribution declares for those extras.
* **mismatched** — installed at a version outside vLLM's specifier: a warning only (the card's base image is
  a vLLM fork, ``0.1.dev20051+g487ecf187``, with a FlashInfer ``0.6.18.dev…`` that no upstream pin matches).

A docker image is immutable, so its answer is kept in the stored image facts under its image ID
(``image-facts.json``, :func:`sparkserve.plan.dialects.facts_path`); a process runtime's environment changes
under the same executable (``pip install`` of the missing one), so it is asked every time.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from sparkserve.config import Config
from sparkserve.nodes.base import Node, NodeError
from sparkserve.plan.dialects import stored_facts, write_facts

#: What the engine does without a distribution, where that is known (the headline's parenthesis).
CONSEQUENCES = {
    "nvidia-cutlass-dsl": "imports cutlass (the CuTe DSL) at kernel warm-up, after the whole load",
    "quack-kernels": "imports quack with the CuTe DSL kernels",
}
#: The import environment of a process rank that the check's interpreter is given too (serve.env's).
PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")
KEEP_IMAGES = 32  # answers kept in the stored facts, newest last
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Requirement:
    """One requirement the check reported: the distribution's normal name, the line as vLLM wrote it, the
    requirement with extras it came through (None: vLLM's own), and the installed version (mismatched)."""

    name: str
    requirement: str
    via: str | None = None
    installed: str | None = None
    why: str | None = None

    def words(self) -> str:
        return self.name + (f" (for {self.via})" if self.via else "")


@dataclass(frozen=True)
class RequiresCheck:
    """The check's answer: vLLM's version (None: no ``vllm`` distribution, nothing checked), what is missing,
    what is installed outside its pins, what could not be read, and how markers were evaluated."""

    vllm: str | None
    missing: list[Requirement] = field(default_factory=list)
    mismatched: list[Requirement] = field(default_factory=list)
    unknown: list[Requirement] = field(default_factory=list)
    checked: int = 0
    how: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.missing

    def missing_line(self, where: str = "in the image") -> str | None:
        """The hard finding in one line (None: nothing is missing)."""
        if not self.missing:
            return None
        names = ", ".join(r.words() for r in self.missing)
        known = [f"vLLM {self.vllm} {CONSEQUENCES[r.name]}" for r in self.missing if r.name in CONSEQUENCES]
        return (f"vllm {self.vllm} requires {names}: not installed {where} — the boot would die at import"
                + (f" ({known[0]})" if known else " (after the model load, at the first import of one of them)"))

    def mismatch_line(self) -> str | None:
        """The warning in one line (None: every installed requirement is inside vLLM's specifier)."""
        if not self.mismatched:
            return None
        rows = ", ".join(f"{r.name} {r.installed} ({r.requirement.removeprefix(r.name).strip() or 'any'})"
                         for r in self.mismatched[:6])
        more = f" and {len(self.mismatched) - 6} more" if len(self.mismatched) > 6 else ""
        return (f"vllm {self.vllm}: installed outside its pins (a fork's own set is normal): {rows}{more}")

    def as_json(self) -> dict[str, object]:
        def rows(rs: list[Requirement]) -> list[dict[str, object]]:
            return [{k: v for k, v in r.__dict__.items() if v is not None} for r in rs]

        return {"vllm": self.vllm, "ok": self.ok, "checked": self.checked, "missing": rows(self.missing),
                "mismatched": rows(self.mismatched), "unknown": rows(self.unknown), "how": self.how,
                "error": self.error}


def _rows(value: Any) -> list[Requirement]:
    out: list[Requirement] = []
    for r in value if isinstance(value, list) else []:
        if isinstance(r, dict) and isinstance(r.get("name") or r.get("requirement"), str):
            out.append(Requirement(str(r.get("name") or r.get("requirement")), str(r.get("requirement") or r["name"]),
                                   *(str(r[k]) if isinstance(r.get(k), str) else None
                                     for k in ("via", "installed", "why"))))
    return out


def parse_requires(raw: Any) -> RequiresCheck | None:
    """The check's JSON (``image_facts.py --requires``, or the ``requires`` fact) → :class:`RequiresCheck`;
    None when there is no answer to read (an older image's facts, a program that printed no object). Pure."""
    if not isinstance(raw, dict) or not ({"vllm", "missing", "error"} & raw.keys()):
        return None
    vllm = raw.get("vllm")
    checked = raw.get("checked")
    return RequiresCheck(str(vllm) if isinstance(vllm, str) else None, _rows(raw.get("missing")),
                         _rows(raw.get("mismatched")), _rows(raw.get("unknown")),
                         checked if isinstance(checked, int) else 0,
                         str(raw["how"]) if isinstance(raw.get("how"), str) else None,
                         str(raw["error"]) if isinstance(raw.get("error"), str) else None)


def parse_output(stdout: str) -> RequiresCheck | None:
    """The program's stdout (its last line is the JSON object) → :func:`parse_requires`. Pure."""
    lines = stdout.strip().splitlines()
    try:
        return parse_requires(json.loads(lines[-1])) if lines else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------- run it


def read_requires(node: Node, image: str) -> RequiresCheck | None:
    """The check run in ``image`` on ``node`` with the image's python3 (no network, no GPU). NodeError
    when the program cannot run there; None when it printed no answer."""
    from sparkserve.image.run import facts_program, run_in_image

    rc, out, err = run_in_image(node, image, ["python3", "-c", facts_program(), "--requires"],
                                step="engine requires", timeout=TIMEOUT_S)
    if rc != 0:
        raise NodeError(node.name, "engine requires", f"the facts program failed in {image} (exit {rc})",
                        last_lines=err.strip().splitlines()[-10:])
    return parse_output(out)


def read_requires_process(node: Node, cfg: Config) -> RequiresCheck | None:
    """runtime: process — the check run by the interpreter ``serve.vllm`` runs on ``node`` (its venv's python,
    its ``#!`` line), with serve.env's Python import variables. NodeError when that interpreter is not known
    (a shell launcher) or the program fails; None when it printed no answer."""
    from sparkserve.image.run import facts_program
    from sparkserve.nodes.process_remote import run_remote

    env = {k: v for k, v in cfg.serve.env.items() if k in PYTHON_ENV}
    reply = run_remote(node, {"verb": "python", "root": "", "exe": cfg.serve.vllm, "program": facts_program(),
                              "args": ["--requires"], "env": env, "timeout_s": TIMEOUT_S},
                       step="engine requires", timeout=TIMEOUT_S + 30)
    if reply.get("error"):
        raise NodeError(node.name, "engine requires", f"serve.vllm: {reply['error']}")
    if reply.get("rc") != 0:
        raise NodeError(node.name, "engine requires", f"the facts program failed under {reply.get('interpreter')} "
                        f"(exit {reply.get('rc')})", last_lines=list(reply.get("stderr") or []))
    return parse_output(str(reply.get("stdout") or ""))


# ------------------------------------------------------------------------------ kept per image ID


def stored_requires(image_id: str) -> RequiresCheck | None:
    """The answer kept for ``image_id`` (None: never asked)."""
    return parse_requires((stored_facts().get("requires") or {}).get(image_id))


def remember_requires(image_id: str, raw: Any) -> None:
    """Keep the check's raw answer for ``image_id`` in the stored image facts (best effort: an unusable state
    dir only means the next `up` asks again)."""
    if parse_requires(raw) is None:
        return
    data = stored_facts()
    kept = data.get("requires") if isinstance(data.get("requires"), dict) else {}
    kept.pop(image_id, None)
    kept[image_id] = raw
    data["requires"] = dict(list(kept.items())[-KEEP_IMAGES:])
    with contextlib.suppress(OSError):  # a cache: not kept, it is read again next time
        write_facts(data)


def engine_requires(cfg: Config, nodes: dict[str, Node], image_id: str) -> tuple[RequiresCheck | None, bool]:
    """(the head's answer, whether it was kept from before) for `up`: docker — kept per image ID, else read
    in the image once and kept; process — asked of serve.vllm's interpreter every time. NodeError when it
    cannot be asked."""
    head = nodes[cfg.head.name]
    if cfg.runtime != "docker":
        return read_requires_process(head, cfg), False
    kept = stored_requires(image_id)
    if kept is not None:
        return kept, True
    raw_check = read_requires(head, cfg.image.ref)
    if raw_check is not None:
        remember_requires(image_id, raw_check.as_json())
    return raw_check, False
