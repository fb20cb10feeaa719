"""Byte sizes: what people write in YAML (``8GiB``) and what vLLM's parser accepts (``8G``)."""

from __future__ import annotations

import re

_BINARY = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$")


def parse_size(value: int | str) -> int:
    """``8GiB``/``8G``/``8 GiB``/``8589934592`` → bytes (binary units); ``8GB``/``8g`` → decimal.

    vLLM's convention: upper-case single letters are binary, lower-case decimal. ``GiB`` is binary,
    ``GB`` decimal. Raises ValueError with a readable message.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size such as 8GiB or 8589934592")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be positive")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size (use e.g. 8GiB, 8G or 8589934592)")
    number, letter, iec, b = m.groups()
    binary = iec or (letter.isupper() and not b)
    factor = (_BINARY if binary else _DECIMAL)[letter.lower()]
    n = float(number) * factor
    if n != int(n) or n <= 0:
        raise ValueError(f"{value!r} is not a whole positive number of bytes")
    return int(n)


def vllm_size(n: int) -> str:
    """Bytes → the shortest form vLLM 0.33's human-readable int parser accepts (``8G``, ``512M``, int)."""
    for letter, factor in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n % factor == 0:
            return f"{n // factor}{letter}"
    return str(n)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
