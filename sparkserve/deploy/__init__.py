"""Stage 7 — deploy: the boot path — a plan made true on every node, and kept honest.

``up`` (preflight → same image everywhere → drafter sync → followers, then head → one wait → rank parity →
gates), teardown with Ctrl-C/signal discipline, ``down`` / ``status`` / ``logs``, ``swap-drafter`` with
rollback, the head lock, the node checks (``doctor``), the unified-memory watchdog, the live gates (collect
logs and facts per node, then let ``observe`` judge), ``replicas: N`` behind the router. Every step has a
timeout and an error that names the node, the step and the lines that explain it.

May import: every lower stage — ``image`` (is the engine on every node, its dialect), ``nodes``, ``measure``,
``observe``, ``plan``, ``models`` — and the ground modules. Never ``campaign``, ``operate`` or the CLI.
"""
