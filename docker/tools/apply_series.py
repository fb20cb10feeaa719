#!/usr/bin/env python3
"""Apply whole-file overlays and a patch series to a vLLM tree, strictly (standard library + ``git apply``).

    python3 apply_series.py --series patches/vllm/series --root SITE --lock lock.json --manifest applied.json
    python3 apply_series.py --series … --root SITE --relock        # no lock checks; prints the lock's entries
    python3 apply_series.py --overlays ctx/overlays.json --root SITE --compile    # the card's lane
    python3 apply_series.py --overlays ctx/overlays.json --verify-only            # a prebuilt image, as it is

``--overlays`` names a JSON file: ``overlays`` (each ``path`` under site-packages and its ``sha256``; the bytes
sit beside it as ``overlays/<path>``), ``markers`` (a file and a literal it must contain) and ``registry``
(architectures vLLM's ModelRegistry must map to a defined class, read with ``ast``: no torch import). Each
overlay's sha256 is checked before it is copied (the context's bytes) and after (the file at its
site-packages path), then it byte-compiles; the markers and the registry are checked after every overlay.
With ``--verify-only`` nothing is copied: the tree must already hold every overlay's bytes.

``SITE`` is a site-packages directory holding ``vllm/`` (the wheel's own layout) or a vLLM checkout: patches
carry ``a/vllm/…`` paths, so one file applies unchanged to both. The rules, in order:

1. the tree is clean: in site-packages every file of vLLM's ``RECORD`` still has the wheel's sha256, except
   the overlays' own paths (the "known-dirty" set: a base may already carry them) and nothing else; in a
   git checkout ``git status --porcelain`` is empty;
2. each upstream check (``--checks``: a file and a literal it must contain, with where it was verified)
   still holds. A check marked ``"expect": "broken"`` records a known upstream defect instead: while the
   literal is there it is "still broken"; once it is gone it is reported as "fixed" (a line to act on,
   never a refusal), and a file the tree lacks (a wheel without FlashInfer) is "not in this tree";
3. per patch, in series order: its sha256 is the lock's; its ``Touches:`` header names exactly the files
   its diff touches; ``git apply --reverse --check`` passing means it is already in the tree — skipped as
   "already upstream" when its ``Upstream:`` header says ``merged in <commit>``, a refusal otherwise; each
   touched file's sha256 before is the lock's (this sees offset-only drift, which every patch tool
   accepts); ``git apply --check`` (never GNU ``patch``: its default fuzz applied a drifted hunk
   silently), then ``git apply``; each touched file's sha256 after is the lock's; touched ``.py`` files
   byte-compile (``--compile``).

Overlays are copied before the series, so a patch may build on an overlay (its "before" digest is then
the overlay's). A refusal prints ``apply_series: error: <patch>: <what>`` (naming the hunk when ``git apply`` names a
line) and exits 1, leaving files touched by earlier patches of this run as they were before the run.
Progress lines start with ``==> patch `` so a build log shows which patch is running.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import os
import py_compile
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@(.*)$")
DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
FAILED_AT = re.compile(r"error: patch failed: (\S+):(\d+)")
MERGED = re.compile(r"merged in\s+([0-9a-f]{7,40})", re.I)


class Refusal(Exception):
    """One clear reason the series cannot be applied."""


@dataclass
class Patch:
    name: str
    path: Path
    data: bytes
    headers: dict[str, str]
    files: list[str]
    hunks: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)  # file -> (start, len, text)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def touches(self) -> list[str]:
        return self.headers.get("Touches", "").split()

    @property
    def merged_in(self) -> str | None:
        m = MERGED.search(self.headers.get("Upstream", ""))
        return m.group(1) if m else None


def read_series(series: Path) -> list[Patch]:
    """The series file: one patch file name per line (relative to the series file), ``#`` comments."""
    patches = []
    for raw in series.read_text().splitlines():
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        path = series.parent / name
        if not path.is_file():
            raise Refusal(f"{name}: listed in {series.name} but there is no such file")
        patches.append(parse_patch(name, path))
    return patches


def parse_patch(name: str, path: Path) -> Patch:
    data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    head, sep, _ = text.partition("\ndiff --git ")
    if not sep:
        raise Refusal(f"{name}: no 'diff --git' in it (the series takes git format-patch files)")
    headers: dict[str, str] = {}
    for line in head.splitlines():
        m = re.match(r"^(Upstream|Base|Touches|Why):\s*(.*)$", line)
        if m:
            headers[m.group(1)] = m.group(2).strip()
    missing = [h for h in ("Upstream", "Base", "Touches") if h not in headers]
    if missing:
        raise Refusal(f"{name}: header lacks {', '.join(m + ':' for m in missing)}")
    files: list[str] = []
    hunks: dict[str, list[tuple[int, int, str]]] = {}
    current = None
    for line in text.splitlines():
        m = DIFF.match(line)
        if m:
            current = m.group(2)
            files.append(current)
            hunks[current] = []
            continue
        h = HUNK.match(line)
        if h and current is not None:
            hunks[current].append((int(h.group(1)), int(h.group(2) or 1), line))
    return Patch(name, path, data, headers, files, hunks)


def sha256_file(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # GIT_CEILING_DIRECTORIES: never let git find a repository *around* a site-packages tree (git apply
    # would then resolve paths from that repository's top and skip ours, git-apply(1))
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.resolve().parent))
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)


def is_checkout(root: Path) -> bool:
    return (root / ".git").exists()


def dirty_files(root: Path) -> list[str]:
    """Files that differ from the pristine tree: RECORD mismatches (site-packages) or git status (checkout)."""
    if is_checkout(root):
        r = git(root, "status", "--porcelain")
        return [line[3:] for line in r.stdout.splitlines() if line.strip()]
    records = sorted(root.glob("vllm-*.dist-info/RECORD"))
    if not records:
        raise Refusal(f"{root}: neither a git checkout nor a site-packages tree with vllm-*.dist-info/RECORD")
    bad = []
    with open(records[0], newline="") as f:
        for row in csv.reader(f):
            if len(row) != 3 or not row[1].startswith("sha256="):
                continue
            path = root / row[0]
            if not path.is_file():
                continue  # a stand-in tree may carry a subset of the wheel; absent files are not edits
            h = hashlib.sha256(path.read_bytes()).digest()
            if base64.urlsafe_b64encode(h).rstrip(b"=").decode() != row[1].removeprefix("sha256="):
                bad.append(row[0])
    return bad


def find_root(root: str) -> Path:
    if root != "auto":
        return Path(root)
    for p in sys.path:
        if p and (Path(p) / "vllm" / "_version.py").is_file():
            return Path(p)
    raise SystemExit("apply_series: error: no vllm/_version.py on sys.path (pass --root DIR)")


def check_upstream_facts(root: Path, checks: Path | None, say=print) -> list[dict[str, str]]:
    """Every upstream check, with its ``status``: ``holds`` | ``still-broken`` | ``fixed`` | ``not-in-tree``."""
    if checks is None:
        return []
    facts = json.loads(checks.read_text())
    for fact in facts:
        path = root / fact["file"]
        text = path.read_text() if path.is_file() else None
        if fact.get("expect") == "broken":
            if text is None:
                fact["status"] = "not-in-tree"
            elif fact["contains"] in text:
                fact["status"] = "still-broken"
            else:
                fact["status"] = "fixed"
                say(f"==> upstream check: FIXED? {fact['file']} no longer contains {fact['contains']!r} "
                    f"(the known defect: {fact['why']}; verified broken at {fact['verified_at']}): re-test "
                    "this lane on a Spark")
            continue
        if text is None or fact["contains"] not in text:
            raise Refusal(f"upstream check: {fact['file']} no longer contains {fact['contains']!r} "
                          f"(verified at {fact['verified_at']}: {fact['why']})")
        fact["status"] = "holds"
    return facts


# ---------------------------------------------------------------------------------------------- overlays


def read_overlays(path: Path | None) -> dict:
    if path is None:
        return {"overlays": [], "markers": [], "registry": []}
    plan = json.loads(path.read_text())
    return {"overlays": plan.get("overlays", []), "markers": plan.get("markers", []),
            "registry": plan.get("registry", []), "dir": path.parent / "overlays"}


def apply_overlays(root: Path, plan: dict, *, verify_only: bool = False, say=print) -> list[dict[str, object]]:
    """Copy each overlay over site-packages (sha256 checked before and after, then byte-compiled), or with
    ``verify_only`` check that the tree already holds its bytes. The manifest entries."""
    done: list[dict[str, object]] = []
    for o in plan["overlays"]:
        rel, want = o["path"], o["sha256"]
        target = root / rel
        before = sha256_file(target)
        if verify_only:
            if before != want:
                raise Refusal(f"overlay {rel}: the image's file is {str(before)[:12]} but the recipe says "
                              f"{want[:12]}" + (" (absent)" if before is None else ""))
            done.append({"path": rel, "sha256": want, "before": before, "after": before, "status": "present"})
            say(f"==> overlay {rel}: present, sha256 {want[:16]}")
            continue
        src = plan["dir"] / rel
        got = sha256_file(src)
        if got != want:
            raise Refusal(f"overlay {rel}: the file to copy is sha256 {str(got)[:12]} but the recipe says "
                          f"{want[:12]} (refused before copying)")
        if not target.parent.is_dir():
            raise Refusal(f"overlay {rel}: {target.parent} is not in the base (an overlay replaces a file of it)")
        old = target.read_bytes() if target.is_file() else None
        target.write_bytes(src.read_bytes())
        after = sha256_file(target)
        if after != want:
            if old is not None:
                target.write_bytes(old)
            raise Refusal(f"overlay {rel}: sha256 {str(after)[:12]} after copying, the recipe says {want[:12]}")
        py_compile.compile(str(target), doraise=True)
        done.append({"path": rel, "sha256": want, "before": before, "after": after, "status": "copied"})
        say(f"==> overlay {rel}: copied, sha256 {want[:16]} before and after")
    return done


def check_markers(root: Path, plan: dict, say=print) -> None:
    """The card's gate: each marker in its file, each architecture registered with its class defined."""
    for m in plan["markers"]:
        path = root / m["file"]
        if not path.is_file() or m["contains"] not in path.read_text(errors="replace"):
            raise Refusal(f"marker: {m['file']} lacks {m['contains']!r}" + (f" ({m['why']})" if m.get("why") else ""))
    if plan["markers"]:
        say(f"==> markers: {', '.join(repr(m['contains']) for m in plan['markers'])} present")
    if plan["registry"]:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from image_facts import registry_classes  # the same reader the image facts use

        found = registry_classes(root, set(plan["registry"]))
        for arch in plan["registry"]:
            if arch not in found:
                raise Refusal(f"registry: {arch} is not in vLLM's ModelRegistry "
                              "(vllm/model_executor/models/registry.py)")
            if not found[arch]["defined"]:
                raise Refusal(f"registry: {arch} → {found[arch]['module']}.{found[arch]['class']} is not defined")
        say(f"==> registry: {', '.join(plan['registry'])} registered")


def name_hunk(patch: Patch, stderr: str) -> str:
    """'hunk #2 of vllm/x.py (@@ -163,7 …)' from git apply's 'patch failed: file:line', else its last line."""
    m = FAILED_AT.search(stderr)
    if m:
        file, line = m.group(1), int(m.group(2))
        for i, (start, _length, text) in enumerate(patch.hunks.get(file, []), 1):
            if start == line:
                return f"hunk #{i} of {file} ({text.strip()}) does not apply"
        return f"{file}:{line}: does not apply"
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "git apply failed"


def apply_series(root: Path, patches: list[Patch], lock: dict | None, *, compile_py: bool = False,
                 say=print, done: list[dict[str, object]] | None = None) -> list[dict[str, object]]:
    """Apply every patch (rules in the module docstring); the manifest entries, one per patch, appended to
    ``done`` as they happen (so a caller can revert what a later refusal left applied)."""
    locked = {p["name"]: p for p in (lock or {}).get("patches", [])}
    if lock is not None:
        want = [p["name"] for p in lock.get("patches", [])]
        have = [p.name for p in patches]
        if want != have:
            raise Refusal(f"series is {have} but the lock has {want}; re-lock")
    done = [] if done is None else done
    for patch in patches:
        say(f"==> patch {patch.name}: checking")
        entry = locked.get(patch.name)
        if lock is not None and entry is not None and entry["sha256"] != patch.sha256:
            raise Refusal(f"{patch.name}: sha256 {patch.sha256[:12]} but the lock has {entry['sha256'][:12]}; "
                          "the patch changed since it was locked (re-lock)")
        if sorted(patch.touches) != sorted(patch.files):
            raise Refusal(f"{patch.name}: Touches: says {' '.join(patch.touches) or '(nothing)'} but the diff "
                          f"touches {' '.join(patch.files)}")
        before = {f: sha256_file(root / f) for f in patch.files}
        if git(root, "apply", "--reverse", "--check", str(patch.path.resolve())).returncode == 0:
            if patch.merged_in:
                say(f"==> patch {patch.name}: already upstream (merged in {patch.merged_in}); skipped")
                done.append({"name": patch.name, "sha256": patch.sha256, "status": "already-upstream",
                             "touches": {f: {"before": before[f], "after": before[f]} for f in patch.files}})
                continue
            raise Refusal(f"{patch.name}: already present in the tree (git apply --reverse --check passes); "
                          f"the base contains it now: mark it 'Upstream: merged in <commit>' or drop it")
        if entry is not None:
            for f in patch.files:
                want_before = entry["touches"].get(f, {}).get("before")
                if before[f] != want_before:
                    raise Refusal(f"{patch.name}: {f} drifted: sha256 {str(before[f])[:12]} but the lock says "
                                  f"{str(want_before)[:12]} before this patch (the base moved; re-lock and "
                                  "review the patch)")
        r = git(root, "apply", "--check", "-v", str(patch.path.resolve()))
        if r.returncode != 0:
            raise Refusal(f"{patch.name}: {name_hunk(patch, r.stderr)}")
        r = git(root, "apply", str(patch.path.resolve()))
        if r.returncode != 0:
            raise Refusal(f"{patch.name}: {name_hunk(patch, r.stderr)}")
        after = {f: sha256_file(root / f) for f in patch.files}
        if entry is not None:
            for f in patch.files:
                want_after = entry["touches"].get(f, {}).get("after")
                if after[f] != want_after:
                    git(root, "apply", "--reverse", str(patch.path.resolve()))
                    raise Refusal(f"{patch.name}: {f} is {str(after[f])[:12]} after applying but the lock says "
                                  f"{str(want_after)[:12]} (reverted)")
        if compile_py:
            for f in patch.files:
                if f.endswith(".py") and (root / f).is_file():
                    py_compile.compile(str(root / f), doraise=True)
        say(f"==> patch {patch.name}: applied ({', '.join(patch.files)})")
        done.append({"name": patch.name, "sha256": patch.sha256, "status": "applied", "upstream":
                     patch.headers["Upstream"], "base": patch.headers["Base"],
                     "touches": {f: {"before": before[f], "after": after[f]} for f in patch.files}})
    return done


def _revert(root: Path, patches: list[Patch], done: list[dict[str, object]]) -> None:
    by_name = {p.name: p for p in patches}
    for entry in reversed(done):
        if entry["status"] == "applied":
            git(root, "apply", "--reverse", str(by_name[str(entry["name"])].path.resolve()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=Path, help="the series file (none: overlays only)")
    ap.add_argument("--overlays", type=Path, help="overlays.json: whole files, markers, registry (module doc)")
    ap.add_argument("--verify-only", action="store_true", help="copy nothing: the tree must already hold "
                    "every overlay (a prebuilt image)")
    ap.add_argument("--root", default="auto", help="site-packages holding vllm/, or a vLLM checkout "
                    "(default: the directory on sys.path that holds vllm/_version.py)")
    ap.add_argument("--lock", type=Path, help="the recipe lock (JSON); its 'patches' entries are checked")
    ap.add_argument("--checks", type=Path, help="upstream facts that must still hold (JSON list)")
    ap.add_argument("--manifest", type=Path, help="write what was applied here (JSON)")
    ap.add_argument("--compile", action="store_true", help="byte-compile the touched .py files")
    ap.add_argument("--relock", action="store_true", help="no lock checks; print the lock's patch entries")
    args = ap.parse_args(argv)
    patches: list[Patch] = []
    done: list[dict[str, object]] = []
    args.root = find_root(args.root)
    out = sys.stderr if args.relock else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    overlays: list[dict[str, object]] = []
    olds: dict[str, bytes | None] = {}
    try:
        plan = read_overlays(args.overlays)
        patches = read_series(args.series) if args.series else []
        known = {o["path"] for o in plan["overlays"]}
        dirty = [f for f in dirty_files(args.root) if f not in known]
        if dirty:
            shown = ", ".join(dirty[:5]) + (f" (+{len(dirty) - 5} more)" if len(dirty) > 5 else "")
            raise Refusal(f"{args.root}: the tree is not pristine: {shown}"
                          + (f" (only the overlays may differ from RECORD: {', '.join(sorted(known))})" if known
                             else ""))
        facts = check_upstream_facts(args.root, args.checks, say=say)
        olds = {str(o["path"]): (args.root / o["path"]).read_bytes() if (args.root / o["path"]).is_file() else None
                for o in plan["overlays"]}
        overlays = apply_overlays(args.root, plan, verify_only=args.verify_only, say=say)
        check_markers(args.root, plan, say=say)
        lock = None if args.relock or args.lock is None else json.loads(args.lock.read_text())
        apply_series(args.root, patches, lock, compile_py=args.compile, done=done, say=say)
    except Refusal as e:
        _revert(args.root, patches, done)
        for rel, old in olds.items():  # the overlays copied by this run go back too
            if old is not None and not args.verify_only:
                (args.root / rel).write_bytes(old)
        print(f"apply_series: error: {e}", file=sys.stderr)
        return 1
    manifest = {"patches": done, "upstream_checks": facts, "overlays": overlays}
    if args.manifest:
        args.manifest.parent.mkdir(parents=True, exist_ok=True)
        args.manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if args.relock:
        json.dump({"patches": [{k: e[k] for k in ("name", "sha256", "touches")} for e in done]}, sys.stdout,
                  indent=1, sort_keys=True)
        print()
    status = [f.get("status") for f in facts]
    broken = (f", {status.count('still-broken')} known upstream defects still there, {status.count('fixed')} "
              f"fixed" if any(f.get("expect") == "broken" for f in facts) else "")
    say(f"==> series: {len(overlays)} overlays, {sum(e['status'] == 'applied' for e in done)} applied, "
        f"{sum(e['status'] == 'already-upstream' for e in done)} already upstream, "
        f"{status.count('holds')} upstream checks hold{broken}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
