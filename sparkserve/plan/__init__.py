"""Stage 2 — plan: config → exactly what will run, before anything runs.

Per node: the image, container name, vLLM argv and env, mounts, ports, graph capture sizes, KV bytes and the
fabric env; the launcher script rendered from the same plan; the pre-flight rules (K ≤ block − 1, mask file,
taps, …) and vLLM 0.33's own ``vllm serve`` parser judging every argv. The only place argv and env are built.

May import: ``models`` and the ground modules. Pure: never a node or the network (``vllm_args`` runs vLLM's
parser in a local child process — a computation, and the one allowed ``subprocess``).
"""
