"""Stage 3 — observe: vLLM log text → events → verdicts.

``logpatterns`` is the one table of vLLM log lines (0.10 … 0.33, Ray, docker prefixes); it also names the
lines that end a boot (``FATAL``) and the boot milestones the memory watchdog follows. Then, in order:

* ``logline`` — one physical line → records (wrappers, prefixes, colour, glued tqdm bars off);
* ``reader`` — a file's bytes: which lines to read (anchor sweep), hard wraps, traceback extents;
* ``events`` — a record → the table rows it matches; ``logs`` — one file → ``ParsedLog`` (``parse_log``);
* ``ranks``, ``engine_config`` — which rank a line is from, what the engine was configured with;
* ``analyze`` — several files → the ``logs analyze`` contract (``Analysis``);
* ``gate_inputs``, ``gates``, ``gate_report`` — expectations and live facts → ``judge`` → ``GateReport``;
* ``saved`` — the offline front door: saved log files → ``analyze_files`` / ``judge_files``.

May import: the ground modules and ``models``. Pure: never a node or the network; callers hand it log text,
except ``saved``, which reads the local files a user names.
"""
