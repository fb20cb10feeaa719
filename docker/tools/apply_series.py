#!/usr/bin/env python3
"""Apply a patch series to a vLLM tree, strictly (standard library + ``git apply`` only).

    python3 apply_series.py --series patches/vllm/series --root SITE --lock lock.json --manifest applied.json
    python3 apply_series.py --series … --root SITE --relock        # no lock checks; prints the lock's entries

``SITE`` is a site-packages directory holding ``vllm/`` (the wheel's own layout) or a vLLM checkout: patches
carry ``a/vllm/…`` paths, so one file applies unchanged to both. The rules, in order:

1. the tree is clean: in site-packages every file of vLLM's ``RECORD`` still has the wheel's sha256; in a
   git checkout ``git status --porcelain`` is empty;
2. each upstream check (``--checks``: a file and a literal it must contain, with where it was verified)
   still holds;
3. per patch, in series order: its sha256 is the lock's; its ``Touches:`` header names exactly the files
   its diff touches; ``git apply --reverse --check`` passing means it is already in the tree — skipped as
   "already upstream" when its ``Upstream:`` header says ``merged in <commit>``, a refusal otherwise; each
   touched file's sha256 before is the lock's (this sees offset-only drift, which every patch tool
   accepts); ``git apply --check`` (never GNU ``patch``: its default fuzz applied a drifted hunk
   silently), then ``git apply``; each touched file's sha256 after is the lock's; touched ``.py`` files
   byte-compile (``--compile``).

A refusal prints ``apply_series: error: <patch>: <what>`` (naming the hunk when ``git apply`` names a
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


def check_upstream_facts(root: Path, checks: Path | None) -> list[dict[str, str]]:
    if checks is None:
        return []
    facts = json.loads(checks.read_text())
    for fact in facts:
        path = root / fact["file"]
        text = path.read_text() if path.is_file() else ""
        if fact["contains"] not in text:
            raise Refusal(f"upstream check: {fact['file']} no longer contains {fact['contains']!r} "
                          f"(verified at {fact['verified_at']}: {fact['why']})")
    return facts


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
    ap.add_argument("--series", required=True, type=Path)
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
    try:
        patches = read_series(args.series)
        dirty = dirty_files(args.root)
        if dirty:
            shown = ", ".join(dirty[:5]) + (f" (+{len(dirty) - 5} more)" if len(dirty) > 5 else "")
            raise Refusal(f"{args.root}: the tree is not pristine: {shown}")
        facts = check_upstream_facts(args.root, args.checks)
        lock = None if args.relock or args.lock is None else json.loads(args.lock.read_text())
        out = sys.stderr if args.relock else sys.stdout
        apply_series(args.root, patches, lock, compile_py=args.compile, done=done,
                     say=lambda s: print(s, file=out, flush=True))
    except Refusal as e:
        _revert(args.root, patches, done)
        print(f"apply_series: error: {e}", file=sys.stderr)
        return 1
    manifest = {"patches": done, "upstream_checks": facts}
    if args.manifest:
        args.manifest.parent.mkdir(parents=True, exist_ok=True)
        args.manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if args.relock:
        json.dump({"patches": [{k: e[k] for k in ("name", "sha256", "touches")} for e in done]}, sys.stdout,
                  indent=1, sort_keys=True)
        print()
    print(f"==> series: {sum(e['status'] == 'applied' for e in done)} applied, "
          f"{sum(e['status'] == 'already-upstream' for e in done)} already upstream, "
          f"{len(facts)} upstream checks hold", file=sys.stderr if args.relock else sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
