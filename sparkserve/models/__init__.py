"""Stage 1 — models: what the drafter and target checkpoints are, read from their files alone.

DFlash2 drafter facts (block size, K, taps, mask token and ``mask_embedding.pt``), target geometry (layers,
hidden size, KV heads), safetensors headers without the weights, pickled torch files without torch, and
sha256 manifests of a directory. Data in, records out; files are read on this machine only, and only
through ``models.files``: regular files, size-capped, never blocking, every parse error a BadFile/BadInput.

May import: the ground modules (``sparkserve.errors``, ``units``, ``config``, ``journal``) and the standard
library. Never a node or the network (the import test forbids paramiko, docker, httpx, socket, subprocess).
"""
