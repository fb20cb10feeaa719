"""What the stream ship relies on in a real `docker save` (the rig's docker 20.10, legacy format): every
layer directory's name (its v1 ID) gives its diff_id away from the small ``json`` member that comes before
its ``layer.tar``, so the sender knows each layer before reading it — nothing is hashed or spooled."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from sparkserve.image.ship_node import _v1_diff

pytestmark = pytest.mark.rig


@pytest.mark.parametrize("ref", ["sparkserve-rig/base:bookworm", "sparkserve-emu/vllm:0.33.0-emu"])
def test_every_legacy_layer_directory_names_its_diff_id(rig, rig_docker, ref: str, tmp_path: Path) -> None:
    client = rig_docker[rig.head.name]
    img = client.images.get(ref)
    layers = img.attrs["RootFS"]["Layers"]
    tar = tmp_path / "save.tar"
    with tar.open("wb") as f:
        for chunk in img.save(named=True):
            f.write(chunk)
    seen: dict[str, bytes] = {}
    found = []
    with tarfile.open(tar) as tf:
        for m in tf:  # in stream order: <v1id>/VERSION, <v1id>/json, <v1id>/layer.tar, …
            folder, _, base = m.name.rpartition("/")
            if base == "json" and folder:
                seen[folder] = tf.extractfile(m).read()  # type: ignore[union-attr]
            elif base == "layer.tar":
                assert folder in seen, "the json member must come before the layer"
                real = "sha256:" + hashlib.sha256(tf.extractfile(m).read()).hexdigest()  # type: ignore[union-attr]
                assert _v1_diff(seen[folder], folder, layers) == real
                found.append(real)
    assert sorted(found) == sorted(set(layers))
