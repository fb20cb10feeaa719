"""Sizes: what people write in YAML and what vLLM's --kv-cache-memory-bytes accepts."""

from __future__ import annotations

import pytest

from sparkserve.units import human_bytes, parse_size, vllm_size


@pytest.mark.parametrize(("text", "n"), [
    ("8GiB", 8 * 2**30), ("8 GiB", 8 * 2**30), ("8G", 8 * 2**30), ("8gib", 8 * 2**30),
    ("8GB", 8 * 10**9), ("8g", 8 * 10**9), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
    ("8589934592", 8589934592), (8589934592, 8589934592), ("1k", 1000), ("1K", 1024),
])
def test_parse_size(text: str | int, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["8 gigs", "", "-1G", "0", 0, -5, True, "1.5", "8GiBs", "0.3B"])
def test_parse_size_rejects(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(("n", "text"), [
    (8 * 2**30, "8G"), (512 * 2**20, "512M"), (3 * 2**29, "1536M"), (2**40, "1T"), (1024, "1K"),
    (8 * 10**9, "7812500K"), (10**9 + 1, "1000000001"), (1, "1"),
])
def test_vllm_size_is_what_vllm_accepts_and_round_trips(n: int, text: str) -> None:
    assert vllm_size(n) == text
    assert parse_size(text) == n  # our parser reads it back (vLLM's human_readable_int agrees: upper = binary)


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(8 * 2**30) == "8.00 GiB"
