"""Read what a ``torch.save`` file says without torch and without running its pickle.

A ``.pt`` file written by torch ≥ 1.6 is a zip archive: ``<name>/data.pkl`` (a pickle whose tensors are
persistent references to storages) plus ``<name>/data/<key>`` (raw storage bytes). The pickle is read by
an unpickler that knows only the handful of globals a tensor needs and replaces each with a harmless
stand-in; any other global (``os.system``, ``builtins.eval`` …) is refused, never imported.

Used for ``mask_embedding.pt``: either a tensor, or ``{"embedding": tensor, "mask_token_id": int}``
(vllm-facts.md 5.4), where the id may also be a 0-d integer tensor. The file is read whole, once, from a
regular file of at most ``MASK_LIMIT`` bytes (:mod:`sparkserve.models.files`); nothing after is unbounded.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkserve.models.files import MASK_LIMIT, BadFile, read_regular

MAX_PICKLE_BYTES = 16 * 2**20

# torch storage class name → (dtype name, item size, struct format or None)
_STORAGES: dict[str, tuple[str, int, str | None]] = {
    "DoubleStorage": ("float64", 8, "d"),
    "FloatStorage": ("float32", 4, "f"),
    "HalfStorage": ("float16", 2, "e"),
    "BFloat16Storage": ("bfloat16", 2, None),
    "LongStorage": ("int64", 8, "q"),
    "IntStorage": ("int32", 4, "i"),
    "ShortStorage": ("int16", 2, "h"),
    "CharStorage": ("int8", 1, "b"),
    "ByteStorage": ("uint8", 1, "B"),
    "BoolStorage": ("bool", 1, "?"),
    "Float8_e4m3fnStorage": ("float8_e4m3fn", 1, None),
    "Float8_e5m2Storage": ("float8_e5m2", 1, None),
}
_DTYPES = {v[0] for v in _STORAGES.values()}


class TorchFileError(BadFile):
    """The file is not a readable torch zip archive, or its pickle asks for something not allowed."""


@dataclass(frozen=True)
class StorageRef:
    dtype: str
    itemsize: int
    fmt: str | None
    key: str
    numel: int


@dataclass
class TensorStub:
    """What a tensor would be: dtype and shape, and (for small tensors) its values from the storage."""

    dtype: str
    shape: tuple[int, ...]
    storage: StorageRef
    offset: int
    _archive: _Archive | None = field(default=None, repr=False, compare=False)
    value: int | float | bool | None = None  # filled for one-element tensors while the archive is open

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def item(self) -> int | float | bool:
        """The value of a one-element tensor (read from the archive's storage bytes)."""
        if self.numel != 1:
            raise TorchFileError(f"tensor of shape {list(self.shape)} has no single value")
        if self.storage.fmt is None or self._archive is None:
            raise TorchFileError(f"cannot read a {self.dtype} value without torch")
        start = self.offset * self.storage.itemsize
        chunk = self._archive.storage_bytes(self.storage.key, start, self.storage.itemsize)
        if len(chunk) != self.storage.itemsize:
            raise TorchFileError(f"storage {self.storage.key} is shorter than the tensor says")
        order = "<" if self._archive.little_endian else ">"
        return struct.unpack(order + self.storage.fmt, chunk)[0]


class _Archive:
    def __init__(self, zf: zipfile.ZipFile, prefix: str) -> None:
        self.zf = zf
        self.prefix = prefix
        try:
            self.little_endian = zf.read(prefix + "byteorder").strip() != b"big"
        except KeyError:
            self.little_endian = True

    def storage_bytes(self, key: str, start: int, count: int) -> bytes:
        """``count`` bytes of a storage from ``start`` (only those: a storage may inflate to gigabytes)."""
        name = f"{self.prefix}data/{key}"
        try:
            size = self.zf.getinfo(name).file_size
        except KeyError:
            raise TorchFileError(f"storage {key!r} is missing from the archive") from None
        if start < 0 or start + count > size:
            return b""
        with self.zf.open(name) as f:
            f.seek(start)
            return f.read(count)


def _rebuild_parameter(data: Any, requires_grad: Any = None, backward_hooks: Any = None) -> Any:
    return data


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: _Archive) -> None:
        super().__init__(io.BytesIO(data))
        self.archive = archive

    def _rebuild_tensor(self, storage: Any, offset: Any, size: Any, *_rest: Any) -> TensorStub:
        if not isinstance(storage, StorageRef):
            raise TorchFileError("tensor rebuilt from something that is not a storage")
        shape = tuple(int(s) for s in (size or ()))
        return TensorStub(storage.dtype, shape, storage, int(offset), self.archive)

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return self._rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch" and name in _STORAGES:
            return ("storage-type", name)
        if module == "torch" and name in _DTYPES:
            return ("dtype", name)
        raise TorchFileError(f"refusing pickle global {module}.{name} (only tensors and plain data are read)")

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TorchFileError(f"unknown persistent reference {pid!r:.80}")
        _, stype, key, _location, numel = pid
        if not (isinstance(stype, tuple) and stype[0] == "storage-type"):
            raise TorchFileError(f"unknown storage type {stype!r:.80}")
        dtype, itemsize, fmt = _STORAGES[stype[1]]
        return StorageRef(dtype, itemsize, fmt, str(key), int(numel))


def load(path: Path, *, limit: int = MASK_LIMIT) -> Any:
    """Unpickle a torch zip file of at most ``limit`` bytes into plain Python data with TensorStub in place
    of tensors. Raises BadFile (TorchFileError when the file is there but not a torch file we read)."""
    data = read_regular(path, limit=limit)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, EOFError):  # ValueError/EOFError: a mangled central directory
        raise TorchFileError("not a torch zip archive (legacy or corrupt torch.save format)") from None
    with zf:
        pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise TorchFileError("not a torch archive (no <name>/data.pkl inside)")
        info = zf.getinfo(pkls[0])
        if info.file_size > MAX_PICKLE_BYTES:
            raise TorchFileError(f"data.pkl is {info.file_size} bytes; refusing to read more than {MAX_PICKLE_BYTES}")
        try:
            archive = _Archive(zf, pkls[0][: -len("data.pkl")])
            obj = _RestrictedUnpickler(zf.read(info), archive).load()
            _materialize(obj)  # read scalar values while the archive is open
        except TorchFileError:
            raise
        except Exception as e:  # malformed pickle or archive member (bad CRC, …): any error is a bad file
            raise TorchFileError(f"unreadable pickle: {type(e).__name__}: {str(e)[:200]}") from None
        return obj


def _materialize(obj: Any) -> None:
    """Fill ``value`` of every one-element tensor in ``obj``. Iterative and visiting each container once:
    a pickle can nest 100,000 deep or share one list a million times for a few bytes."""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, TensorStub):
            if v.numel == 1 and v.storage.fmt is not None:
                v.value = v.item()
        elif isinstance(v, dict | list | tuple) and id(v) not in seen:
            seen.add(id(v))
            stack.extend(v.values() if isinstance(v, dict) else v)


@dataclass
class MaskEmbeddingInfo:
    """What ``mask_embedding.pt`` holds, as vLLM 0.33 reads it."""

    form: Literal["dict", "tensor"]
    mask_token_id: int | None
    embedding_shape: list[int]
    embedding_dtype: str
    keys: list[str]

    @property
    def embedding_numel(self) -> int:
        n = 1
        for d in self.embedding_shape:
            n *= d
        return n


def read_mask_embedding(path: Path) -> MaskEmbeddingInfo:
    """Read a mask_embedding.pt (tensor or dict form). Raises TorchFileError saying what is wrong."""
    obj = load(path)
    if isinstance(obj, TensorStub):
        return MaskEmbeddingInfo("tensor", None, list(obj.shape), obj.dtype, [])
    if not isinstance(obj, dict):
        raise TorchFileError(f"holds a {type(obj).__name__}; vLLM expects a tensor or a dict with 'embedding'")
    emb = obj.get("embedding")
    if not isinstance(emb, TensorStub):
        raise TorchFileError("the dict has no 'embedding' tensor")
    raw_id = obj.get("mask_token_id")
    token_id: int | None
    if raw_id is None:
        token_id = None
    elif isinstance(raw_id, bool):
        raise TorchFileError("mask_token_id is a bool, not an integer")
    elif isinstance(raw_id, int):
        token_id = raw_id
    elif isinstance(raw_id, TensorStub):
        if raw_id.numel != 1 or not raw_id.dtype.startswith(("int", "uint")) or raw_id.value is None:
            raise TorchFileError(f"mask_token_id is a {raw_id.dtype} tensor of shape {list(raw_id.shape)}")
        token_id = int(raw_id.value)
    else:
        raise TorchFileError(f"mask_token_id is a {type(raw_id).__name__}, not an integer")
    return MaskEmbeddingInfo("dict", token_id, list(emb.shape), emb.dtype, sorted(str(k) for k in obj))
