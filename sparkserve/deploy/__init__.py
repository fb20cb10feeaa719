"""Stage 6 — deploy: a plan made true on every node, and kept honest.

``up`` (preflight → same image everywhere → drafter sync → followers, then head → one wait → rank parity →
gates), teardown with Ctrl-C/signal discipline, ``down`` / ``status`` / ``logs``, ``swap-drafter`` with
rollback, the head lock, the node checks (``doctor``), the unified-memory watchdog, the live gates (collect
logs and facts per node, then let ``observe`` judge) and image identity / ship. Every step has a timeout and
an error that names the node, the step and the lines that explain it.

May import: every lower stage — ``nodes``, ``measure``, ``observe``, ``plan``, ``models`` — and the ground
modules. Never the CLI.
"""
