"""Download (here, where pip reaches PyPI) the wheels vLLM and sparkserve need that the GPU machine's image lacks.

usage: python3 tests/real/fetch_wheels.py VLLM_WHEEL OUTDIR [REQUIREMENT ...]
(the REQUIREMENTs — sparkserve's own runtime needs, scripts/real-engine passes them — are walked too).
Adapted from ../shared/realvllm/fetch_wheels.py (ours), which fetched the wheels of the first real run.
Walks the wheel's Requires-Dist (no extras) breadth-first with `pip download --no-deps` for
CPython 3.12 / manylinux x86_64, skipping what that image already holds (DEVICE: its package list as of
2026-11-17) and what a serve run does not need (SKIP).
FETCH_CARRY (environment, names split by spaces): packages the image holds but at a version this lane cannot use
(vLLM 0.34.0 needs huggingface_hub>=2, which the image's transformers 5.17 refuses), or that SKIP names but this
lane needs (vLLM 0.34.0's kernel warm-up imports the CuTe DSL, `cutlass`, and quack): fetched and walked anyway.
FETCH_SKIP (environment, names split by spaces): more packages this lane leaves out (0.34.0: the CuTe DSL's CUDA 12
flavour, nvidia-cutlass-dsl-libs-cu12, which the CUDA 13 one makes useless; torch-c-dlpack-ext, which quack asks
for and never imports, and which tvm_ffi needs only for a torch without `__dlpack_c_exchange_api__`).
`fetch_wheels.py --layer BASE_DIR LAYER_DIR` (a layered lane, scripts/real-engine VBASE): prints `DROP WHEEL why`
for each wheel of LAYER_DIR that the base lane's BASE_DIR makes needless: the same file, or the same project at a
version every requirement on it (the Requires-Dist of both dirs' wheels; at least one: a wheel nothing requires,
the lane's vLLM, stays) admits, unless FETCH_CARRY names it (the walk fetches the newest release:
compressed-tensors' bare `loguru` fetched loguru 0.8.0 beside the base's 0.7.3).
Overrides: apache-tvm-ffi>=0.1.11 (xgrammar 0.2.9 needs it; vLLM 0.25.1 pins 0.1.9, which makes
`import xgrammar` fail with "load_lib_module() got an unexpected keyword argument 'extra_lib_paths'").
"""
import glob
import os
import subprocess
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as cn
from packaging.version import Version

DEVICE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""
SKIP = """flashinfer-python flashinfer-cubin ray torchcodec pynvvideocodec tilelang nvidia-cudnn-frontend nvtx
fastsafetensors nvidia-cutlass-dsl quack-kernels tokenspeed-mla humming-kernels mcp opentelemetry-sdk
opentelemetry-api opentelemetry-exporter-otlp opentelemetry-semantic-conventions-ai fastapi-cli
fastapi-cloud-cli email-validator pywin32"""
OVERRIDE = {"apache-tvm-ffi": "apache-tvm-ffi>=0.1.11,<0.2"}
EXTRA = ["uvicorn", "python-multipart", "apache-tvm-ffi",  # fastapi[standard] pieces vLLM imports; xgrammar's need
         "py-spy",  # `supervise`'s forensics dump every rank's stacks with it (tests/real/part_supervise.py)
         "vllm-router==0.1.17"]  # `replicas: N`: vLLM's router (pyproject's replicas extra; tests/real/part_router.py)
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux", "sys_platform": "linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython"}
PLAT = [a for n in ("2_28", "2_27", "2_17", "2_24", "2_31", "2_34", "2_5")
        for a in ("--platform", f"manylinux_{n}_x86_64")]
PLAT += ["--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "--platform", "linux_x86_64"]


def requires(whl, extras=()):
    z = zipfile.ZipFile(whl)
    md = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out = []
    for line in md.splitlines():
        if line.startswith("Requires-Dist:"):
            q = Requirement(line.split(":", 1)[1].strip())
            if not q.marker or any(q.marker.evaluate(dict(ENV, extra=e)) for e in (set(extras) or {""})):
                out.append(str(q))
    return out


def wheel_id(path):
    name, version = os.path.basename(path).split("-")[:2]
    return cn(name), Version(version)


def layer(base_dir, layer_dir):
    carry = {cn(x) for x in os.environ.get("FETCH_CARRY", "").split()}
    base = {wheel_id(w): w for w in glob.glob(f"{base_dir}/*.whl")}
    base_version = {p: v for p, v in base}
    layer_whls = sorted(glob.glob(f"{layer_dir}/*.whl"))
    reqs = [(w, Requirement(r)) for w in layer_whls + list(base.values()) for r in requires(w)]
    for w in layer_whls:
        p, v = wheel_id(w)
        if (p, v) in base:
            print("DROP", os.path.basename(w), "the base lane holds this very wheel")
        elif p in base_version and p not in carry:
            on = [str(r) for src, r in reqs if cn(r.name) == p and src != w]
            # a wheel nothing requires is a root of the lane (its vLLM): kept
            if on and all(Requirement(r).specifier.contains(base_version[p], prereleases=True) for r in on):
                print("DROP", os.path.basename(w), f"the base lane's {p} {base_version[p]} meets every requirement on "
                      f"it ({'; '.join(sorted(set(on)))})")


def main():
    if sys.argv[1] == "--layer":
        layer(sys.argv[2], sys.argv[3])
        return
    vllm_whl, out, also = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    carry = {cn(x) for x in os.environ.get("FETCH_CARRY", "").split()}
    skip = {cn(x) for x in os.environ.get("FETCH_SKIP", "").split()}
    have = ({cn(x) for x in (DEVICE + " " + SKIP).split()} - carry) | skip
    queue, seen = requires(vllm_whl) + EXTRA + also, {}  # name -> (wheel, extras already walked)
    while queue:
        r = Requirement(queue.pop(0))
        n = cn(r.name)
        if n in have:
            continue
        if n in seen:  # already downloaded: walk only extras not seen before (e.g. pydantic-extra-types[pycountry])
            whl, done = seen[n]
            new = set(r.extras) - done
            if new:
                done |= new
                queue += requires(whl, new)
            continue
        spec = OVERRIDE.get(n, str(r).split(";")[0])
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.12", "--implementation", "cp", *PLAT, "-d", out, spec],
                           capture_output=True, text=True)
        if p.returncode:
            seen[n] = (None, set())
            print("FAIL", spec, p.stderr.strip().splitlines()[-1:])
            continue
        whl = [f for f in glob.glob(f"{out}/*.whl") if cn(os.path.basename(f).split("-")[0]) == n][0]
        seen[n] = (whl, set(r.extras))
        queue += requires(whl, r.extras)
        print("OK", os.path.basename(whl))


if __name__ == "__main__":
    main()
