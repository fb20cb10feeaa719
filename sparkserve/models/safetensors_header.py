"""Read a safetensors file's header (names, dtypes, shapes) without loading any tensor.

Format: 8-byte little-endian header length N, then N bytes of JSON ``{name: {dtype, shape, data_offsets}}``
with an optional ``__metadata__`` entry, then the data. Only the 8 bytes and the header are read, from a
regular file (see :mod:`sparkserve.models.files`), after the length field was checked against the file size.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from sparkserve.models.files import BadFile, open_regular, parse_json

MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit

# bits per element of each safetensors dtype
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}


class HeaderError(BadFile):
    """The file is not a readable safetensors file."""


@dataclass(frozen=True)
class TensorHeader:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[list[TensorHeader], dict[str, str]]:
    """(tensors in file order, __metadata__) of one safetensors file. Raises BadFile (HeaderError when
    the file is there but is not safetensors)."""
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError("too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise HeaderError(f"header length {n} does not fit the file ({size} bytes)")
            raw = f.read(n)
        except OSError as e:
            raise HeaderError(f"cannot read: {e.strerror or e}") from None
    if len(raw) < n:  # truncated while being read
        raise HeaderError(f"header length {n} does not fit the file ({size} bytes)")
    try:
        header = parse_json(raw)
    except BadFile as e:
        raise HeaderError(f"header is {e} (not a safetensors file?)") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    tensors: list[TensorHeader] = []
    end = 0
    for name, spec in header.items():
        try:
            dtype = str(spec["dtype"])
            shape = tuple(int(d) for d in spec["shape"])
            begin, stop = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int(Infinity)
            raise HeaderError(f"tensor {name!r} has a malformed header entry") from None
        if stop < begin or any(d < 0 for d in shape):
            raise HeaderError(f"tensor {name!r} has invalid offsets or shape")
        end = max(end, stop)
        tensors.append(TensorHeader(name, dtype, shape))
    if 8 + n + end > size:
        raise HeaderError(f"truncated: tensors need {8 + n + end} bytes, the file has {size}")
    return tensors, {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
