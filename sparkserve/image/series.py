"""The recipe's patch series against a real vLLM wheel, on this machine: no image, no node, no network.

    result = check_series_on_wheel(files, Path("vllm-0.33.0-…-aarch64.whl"))   # SeriesCheck
    lock = lock_from_wheel(files, wheel)                                        # a lock (base unresolved)

The wheel's Python files and ``dist-info`` are unpacked to a temp dir (a wheel is a zip laid out as
site-packages), the same ``docker/tools/apply_series.py`` the Dockerfile runs applies the series there with
the lock's digests, and ``docker/tools/image_facts.py``'s RECORD check must then list exactly the files the
series touches. CI runs this for the x86_64 and the aarch64 wheel (``sparkserve image series-check``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from sparkserve.errors import BadInput
from sparkserve.image.context import RecipeFiles, context_files
from sparkserve.image.recipe import BaseLock, Lock, PatchLock, lock_json, lock_problems, sha256_hex


@dataclass
class SeriesCheck:
    wheel: Path
    ok: bool
    summary: str
    differing: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    applier_output: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {"wheel": self.wheel.name, "ok": self.ok, "summary": self.summary, "differing": self.differing,
                "expected": self.expected}


def unpack_python_tree(wheel: Path, dest: Path) -> None:
    """The wheel's ``vllm/**/*.py`` and ``*.dist-info/*`` under ``dest`` (its site-packages layout)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if (n.startswith("vllm/") and n.endswith(".py")) or ".dist-info/" in n]
            z.extractall(dest, names)
    except (OSError, zipfile.BadZipFile) as e:
        raise BadInput(str(wheel), f"not a readable wheel: {e}") from None


def _ctx(files: RecipeFiles, lock: Lock | None, where: Path) -> Path:
    for name, data in context_files(files, lock).items():
        p = where / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return where


def _apply(ctx: Path, site: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ctx / "tools" / "apply_series.py"), "--root", str(site), "--series",
            str(ctx / "series" / "series"), "--checks", str(ctx / "upstream-checks.json"), *extra]
    return subprocess.run(argv, capture_output=True, text=True)


def _facts(ctx: Path, site: Path) -> dict:
    argv = [sys.executable, str(ctx / "tools" / "image_facts.py"), "--site", str(site), "--no-archs",
            "--applied", str(site / "none.json")]
    res = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(res.stdout))


def _differing(ctx: Path, site: Path) -> list[str]:
    return sorted(_facts(ctx, site)["record"]["differing"])


def check_series_on_wheel(files: RecipeFiles, wheel: Path) -> SeriesCheck:
    """Apply the series to ``wheel`` with the recipe's lock and check the RECORD diff (see module doc)."""
    if files.lock is None:
        raise BadInput(str(files.lock_path), "no lock for this recipe yet")
    stale = [p for p in lock_problems(files.recipe, files.lock, files.series, files.checks)  # the base and its
             if "not resolved to a digest" not in p and "facts are unresolved" not in p]  # facts: on a node
    if stale:
        return SeriesCheck(wheel, False, f"the lock disagrees with {files.path.name}: {stale[0]}")
    with tempfile.TemporaryDirectory(prefix="sparkserve-series-") as tmp:
        site = Path(tmp) / "site"
        unpack_python_tree(wheel, site)
        ctx = _ctx(files, files.lock, Path(tmp) / "ctx")
        res = _apply(ctx, site, "--lock", str(ctx / "lock.json"), "--compile")
        out = (res.stdout + res.stderr).strip().splitlines()
        if res.returncode != 0:
            return SeriesCheck(wheel, False, out[-1] if out else "the applier failed", applier_output=out)
        differing = _differing(ctx, site)
        expected = sorted({f for p in files.lock.patches for f in p.touches})
        ok = differing == expected
        summary = (f"{len(files.lock.patches)} patch(es) applied; RECORD diff = the series' files ({len(expected)})"
                   if ok else f"RECORD diff {differing} is not the series' files {expected}")
        known = [ln.removeprefix("==> series: ").split("upstream checks hold, ", 1)[-1] for ln in out
                 if ln.startswith("==> series: ") and "known upstream defects" in ln]
        fixed = [ln.removeprefix("==> upstream check: ") for ln in out if ln.startswith("==> upstream check: FIXED")]
        summary += "".join(f"; {k}" for k in known) + "".join(f"; {f}" for f in fixed)
        return SeriesCheck(wheel, ok, summary, differing, expected, out)


def lock_from_wheel(files: RecipeFiles, wheel: Path) -> Lock:
    """A lock whose patch digests come from applying the series to ``wheel`` (the files an upstream image of
    that wheel holds). The base stays unresolved — ``image build --relock`` on a node that can pull it pins
    the digest — so a build refuses this lock until then."""
    with tempfile.TemporaryDirectory(prefix="sparkserve-lock-") as tmp:
        site = Path(tmp) / "site"
        unpack_python_tree(wheel, site)
        ctx = _ctx(files, None, Path(tmp) / "ctx")
        res = _apply(ctx, site, "--relock")
        if res.returncode != 0:
            raise BadInput(str(files.path), (res.stderr.strip().splitlines() or ["the applier failed"])[-1])
        entries = json.loads(res.stdout)["patches"]
        vllm = _facts(ctx, site)["vllm"]
    return Lock(recipe=files.recipe.name, lane=files.recipe.lane, base=BaseLock(image=files.recipe.base.image),
                vllm={"version": vllm.get("version"), "commit": vllm.get("commit")},
                patches=[PatchLock.model_validate(e) for e in entries],
                upstream_checks_sha256=sha256_hex(files.checks) if files.checks is not None else None)


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkserve.image.series RECIPE WHEEL``: write RECIPE's lock from WHEEL."""
    from sparkserve.image.context import load_recipe_files

    args = argv if argv is not None else sys.argv[1:]
    files = load_recipe_files(Path(args[0]))
    lock = lock_from_wheel(files, Path(args[1]))
    files.lock_path.write_text(lock_json(lock))
    print(f"wrote {files.lock_path}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
