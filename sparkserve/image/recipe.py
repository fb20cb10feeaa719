"""The image recipe (what a user edits) and its machine-written lock (what a build is held to). Pure.

    recipe = parse_recipe(text, "docker/recipe.yaml")          # BadInput names the field that is wrong
    lock = parse_lock(text, "docker/recipe.lock.json")
    problems = lock_problems(recipe, lock, series)           # [] when the lock is this recipe's
    args = build_args(recipe, lock)                           # every Dockerfile ARG, FROMs digest-pinned
    tag = image_tag(recipe, lock)                             # "<recipe name>:<lock sha256[:12]>"

``series`` is the list of (patch name, patch bytes) the recipe's series file names, in order. The lock's
sha256 (:func:`lock_digest`, over its canonical JSON) is the image tag and the ``io.sparkserve.lock-sha256``
label, so one lock names one image.

Lanes: ``overlay`` (a digest-pinned base; whole-file ``overlays``, each sha256-gated, then the patch
``series``), ``prebuilt`` (an image used as it is: pinned by digest, checked with the same ``overlays`` and
``checks``, never built) and ``source`` (vLLM built from ``vllm.ref``). A recipe marked ``experimental``
carries its known failure, which ``image build`` prints before it builds.

A lock's facts (vLLM version and commit, FlashInfer, torch, CUDA, the serve option list) come only from
running the image (``image build --relock``); a lock shipped before that says ``"unresolved"`` and every build
refuses it.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkserve.errors import BadInput
from sparkserve.image.base_names import same_base

DIGEST_REF = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
UNRESOLVED = "unresolved"
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*$")
Lane = Literal["overlay", "prebuilt", "source"]
LANES = ("overlay", "prebuilt", "source")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BaseSpec(_Strict):
    image: str = Field(min_length=1)
    platform: str = "linux/arm64"


class VllmSpec(_Strict):
    version: str = Field(min_length=1)
    ref: str = Field(min_length=1)


class SourceSpec(_Strict):
    cuda_devel_image: str = Field(min_length=1)
    #: the runner: a CUDA *devel* image (nvcc and headers: FlashInfer, TileLang and DeepGEMM JIT at run time)
    cuda_runtime_image: str = Field(min_length=1)
    torch_index: str = "https://download.pytorch.org/whl/cu130"
    flashinfer_index: str = "https://flashinfer.ai/whl/cu130"

    @model_validator(mode="before")
    @classmethod
    def _no_flashinfer_ref(cls, data: object) -> object:
        if isinstance(data, dict) and "flashinfer_ref" in data:
            raise ValueError("flashinfer_ref: FlashInfer is pinned to exactly what the vLLM being built requires "
                             "(its wheel's METADATA); remove this field")
        return data


class Overlay(_Strict):
    """One whole file copied over site-packages, gated by its sha256 before and after the copy."""

    path: str = Field(min_length=1)  # where it goes, relative to site-packages (vllm/…)
    #: https://… (fetched here, checked) or a path relative to the recipe; a prebuilt image needs none
    source: str | None = None
    sha256: str
    why: str = ""

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/") or not v.endswith(".py"):
            raise ValueError(f"{v!r} must be a relative .py path under site-packages (vllm/…)")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not SHA256.match(v):
            raise ValueError("must be 64 lowercase hex digits")
        return v


class Marker(_Strict):
    file: str = Field(min_length=1)
    contains: str = Field(min_length=1)
    why: str = ""


class Checks(_Strict):
    """What the built (or prebuilt) image must hold, as the card's build gate: each marker in its file,
    each architecture registered in vLLM's ModelRegistry with its class defined."""

    markers: list[Marker] = Field(default_factory=list)
    registry: list[str] = Field(default_factory=list)


class Recipe(_Strict):
    name: str
    lane: Lane = "overlay"
    #: the known failure of a lane that is not proven on a Spark; printed by every build of it
    experimental: str | None = None
    base: BaseSpec
    vllm: VllmSpec
    series: str | None = None
    upstream_checks: str | None = None
    overlays: list[Overlay] = Field(default_factory=list)
    checks: Checks = Field(default_factory=Checks)
    #: keeps the 12.0f family kernels (vLLM's cmake keeps x.0f only when x.0 is a target) + 12.1a ones
    torch_cuda_arch_list: str = "12.0 12.1a"
    extra_pip: list[str] = Field(default_factory=list)
    source: SourceSpec | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v):
            raise ValueError("must be a lowercase image repository name (a-z 0-9 . _ - /)")
        return v

    @field_validator("extra_pip")
    @classmethod
    def _pins(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not PIN.match(p)]
        if bad:
            raise ValueError(f"not an exact 'package==version' pin: {', '.join(bad)}")
        return v

    @field_validator("overlays")
    @classmethod
    def _unique(cls, v: list[Overlay]) -> list[Overlay]:
        paths = [o.path for o in v]
        dup = sorted({p for p in paths if paths.count(p) > 1})
        if dup:
            raise ValueError(f"{', '.join(dup)} named twice")
        return v


class PatchLock(_Strict):
    name: str
    sha256: str
    touches: dict[str, dict[str, str | None]]


class BaseLock(_Strict):
    image: str
    #: ``repo@sha256:…`` from the registry, or None when only the local image ID is known (a base that was
    #: never pushed: a stand-in or a local build); then ``id`` pins it and the build checks it first.
    digest_ref: str | None = None
    id: str | None = None


class Lock(_Strict):
    recipe: str
    lane: Lane
    base: BaseLock
    vllm: dict[str, str | None]
    patches: list[PatchLock] = Field(default_factory=list)
    upstream_checks_sha256: str | None = None
    source: dict[str, str | None] | None = None
    #: path → sha256 of each overlay, and the marker/registry checks (the image's facts read both): an edit to
    #: either makes the lock stale
    overlays: dict[str, str] = Field(default_factory=dict)
    checks: dict[str, Any] = Field(default_factory=dict)
    #: read from the image at relock (flashinfer, torch, cuda, dialect, …), or "unresolved" until then
    facts: dict[str, Any] | Literal["unresolved"] = UNRESOLVED


def _validation_error(source: str, e: ValidationError) -> BadInput:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return BadInput(f"{source}: {where}", str(first["msg"]).removeprefix("Value error, "))


def parse_recipe(text: str, source: str) -> Recipe:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise BadInput(source, f"not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BadInput(source, "must be a mapping (name, lane, base, vllm, series, …)")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        raise _validation_error(source, e) from None
    if recipe.lane == "source" and recipe.source is None:
        raise BadInput(f"{source}: source", "lane 'source' needs source.cuda_devel_image, cuda_runtime_image")
    if recipe.lane == "prebuilt" and recipe.series:
        raise BadInput(f"{source}: series", "a prebuilt image is used as it is: it takes no patch series")
    unsourced = [o.path for o in recipe.overlays if not o.source]
    if recipe.lane != "prebuilt" and unsourced:
        raise BadInput(f"{source}: overlays", f"{unsourced[0]} has no source (a URL or a path to copy it from)")
    return recipe


def unresolved_lock(recipe: Recipe, checks: bytes | None = None) -> Lock:
    """The lock a recipe ships with before anyone ran its image: what the recipe says, every fact that only
    the image can tell "unresolved" (a build refuses it until ``image build --relock``)."""
    return Lock(recipe=recipe.name, lane=recipe.lane, base=BaseLock(image=recipe.base.image),
                vllm={"version": UNRESOLVED, "commit": UNRESOLVED},
                overlays={o.path: o.sha256 for o in recipe.overlays}, checks=lock_checks(recipe), facts=UNRESOLVED,
                upstream_checks_sha256=sha256_hex(checks) if checks is not None else None)


def parse_lock(text: str, source: str) -> Lock:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(source, f"not JSON: {e}") from None
    try:
        return Lock.model_validate(data)
    except ValidationError as e:
        raise _validation_error(source, e) from None


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def lock_digest(lock: Lock) -> str:
    """sha256 (hex) of the lock's canonical JSON: the image tag and its ``io.sparkserve.lock-sha256`` label."""
    return hashlib.sha256(canonical(lock.model_dump(mode="json"))).hexdigest()


def lock_json(lock: Lock) -> str:
    return json.dumps(lock.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


def series_names(series_text: str) -> list[str]:
    """Patch file names of a series file, in order (``#`` comments and blank lines skipped)."""
    return [n for n in (raw.split("#", 1)[0].strip() for raw in series_text.splitlines()) if n]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lock_checks(recipe: Recipe) -> dict[str, Any]:
    """The recipe's marker and registry checks as its lock records them ({} when there are none)."""
    if not recipe.checks.markers and not recipe.checks.registry:
        return {}
    return recipe.checks.model_dump(mode="json")


def overlay_plan(recipe: Recipe) -> dict[str, object]:
    """What the in-image applier gets as ``overlays.json``: each overlay's path and sha256 (its bytes travel
    as ``overlays/<path>``), the marker and registry checks."""
    return {"overlays": [{"path": o.path, "sha256": o.sha256, "why": o.why} for o in recipe.overlays],
            "markers": [m.model_dump(mode="json") for m in recipe.checks.markers],
            "registry": list(recipe.checks.registry)}


def lock_problems(recipe: Recipe, lock: Lock, series: list[tuple[str, bytes]],
                  checks: bytes | None = None) -> list[str]:
    """Each way ``lock`` is not the lock of ``recipe`` with this series (empty: it is)."""
    out = []
    if lock.recipe != recipe.name:
        out.append(f"recipe name is {recipe.name!r}, the lock's is {lock.recipe!r}")
    if lock.lane != recipe.lane:
        out.append(f"lane is {recipe.lane!r}, the lock's is {lock.lane!r}")
    if not same_base(lock.base.image, recipe.base.image):  # the digest is the base: a re-host is not a change
        out.append(f"base.image is {recipe.base.image!r}, the lock's is {lock.base.image!r}")
    if lock.facts == UNRESOLVED or UNRESOLVED in lock.vllm.values():
        out.append("the lock's facts are unresolved (never read from the image): run `sparkserve image build "
                   "--relock` on a node that can pull the base")
    elif lock.vllm.get("version") != recipe.vllm.version:
        out.append(f"vllm.version is {recipe.vllm.version!r}, the lock has {lock.vllm.get('version')!r}")
    want_overlays = {o.path: o.sha256 for o in recipe.overlays}
    if lock.overlays != want_overlays:
        changed = sorted(set(want_overlays.items()) ^ set(lock.overlays.items()))
        out.append(f"overlays changed since the lock was written ({', '.join(sorted({p for p, _ in changed}))})")
    if lock.checks != lock_checks(recipe):
        out.append("the recipe's marker/registry checks changed since the lock was written")
    names = [n for n, _ in series]
    locked = [p.name for p in lock.patches]
    if names != locked:
        out.append(f"series is {names or '(empty)'}, the lock has {locked or '(empty)'}")
    else:
        for (name, data), p in zip(series, lock.patches, strict=True):
            if sha256_hex(data) != p.sha256:
                out.append(f"{name} changed since it was locked (sha256 {sha256_hex(data)[:12]}, lock "
                           f"{p.sha256[:12]})")
    want_checks = sha256_hex(checks) if checks is not None else None
    if want_checks != lock.upstream_checks_sha256:
        out.append("upstream checks changed since the lock was written")
    pinned = recipe.base.image.rpartition("@")[2] if "@sha256:" in recipe.base.image else None
    if pinned and lock.base.digest_ref and not lock.base.digest_ref.endswith("@" + pinned):
        out.append(f"the recipe pins the base to {pinned[:19]}…, the lock has {lock.base.digest_ref}")
    if lock.base.digest_ref is None and lock.base.id is None:
        out.append(f"the base {lock.base.image} is not resolved to a digest yet")
    elif lock.base.digest_ref is not None and not DIGEST_REF.match(lock.base.digest_ref):
        out.append(f"base.digest_ref {lock.base.digest_ref!r} is not repo@sha256:<64 hex>")
    elif lock.base.id is not None and not IMAGE_ID.match(lock.base.id):
        out.append(f"base.id {lock.base.id!r} is not sha256:<64 hex>")
    return out


def pinned_base(lock: Lock) -> str:
    """What the Dockerfile's ``FROM ${BASE_IMAGE}`` gets: the digest reference, else the local image ID's
    tag (the build checks that tag's ID against ``lock.base.id`` first)."""
    return lock.base.digest_ref or lock.base.image


def series_label(lock: Lock) -> str:
    """``io.sparkserve.series``: ``name=sha256[:16]`` per patch, comma-separated ("" for no patches)."""
    return ",".join(f"{p.name}={p.sha256[:16]}" for p in lock.patches)


def build_args(recipe: Recipe, lock: Lock) -> dict[str, str]:
    """Every ARG the Dockerfile reads for the recipe's lane."""
    args = {
        "LOCK_SHA256": lock_digest(lock),
        "SERIES_DIGESTS": series_label(lock),
        "VLLM_VERSION": lock.vllm.get("version") or "",
        "VLLM_COMMIT": lock.vllm.get("commit") or "",
        "RECIPE_NAME": recipe.name,
        "TORCH_CUDA_ARCH_LIST": recipe.torch_cuda_arch_list,
    }
    # BuildKit parses every stage's FROM, built or not, and refuses a blank one: the other lane's FROM ARGs
    # get this lane's own pinned image (those stages are never built, so nothing is pulled for them)
    if recipe.lane == "overlay":
        base = pinned_base(lock)
        args |= {"BASE_IMAGE": base, "BASE_REF": base, "CUDA_DEVEL_IMAGE": base, "CUDA_RUNTIME_IMAGE": base}
    else:
        src = lock.source or {}
        assert recipe.source is not None
        runtime = src.get("cuda_runtime_image") or ""
        args |= {"CUDA_DEVEL_IMAGE": src.get("cuda_devel_image") or "", "CUDA_RUNTIME_IMAGE": runtime,
                 "BASE_IMAGE": runtime, "TORCH_INDEX": recipe.source.torch_index,
                 "FLASHINFER_INDEX": recipe.source.flashinfer_index, "EXTRA_PIP": " ".join(recipe.extra_pip)}
    return args


def image_tag(recipe: Recipe, lock: Lock) -> str:
    return f"{recipe.name}:{lock_digest(lock)[:12]}"
