"""Stage 4 — measure: the model card's bench protocol against a live server, and the A/B table of its records.

A cell's path, top-down (``Sampling.protocol``: ``card``, the model card's holdout client, or ``forced``)::

    run.py         run_cell / bench_and_record: check the model, (card) render, scrape, requests, scrape, summary
    ├─ chat_template.py  card: the target's chat template → each prompt's text (jinja2 alone, no tokenizer)
    ├─ scrape.py   /metrics and /v1/models over httpx            → metrics.py  (Prometheus text → counters → AL)
    ├─ completions.py  card: one /v1/completions request, not streamed, bounded → httpstream.py
    ├─ client.py   forced: one streamed request, deadline + stall → httpstream.py (lean HTTP/1.1 body stream)
    │                                                             → stream.py   (SSE chat chunks → tokens, usage)
    └─ summary.py  outcomes + two snapshots → BenchResult, with the guards that refuse a cell
    records.py     Cell, CELLS, Sampling (CARD_SAMPLING), RequestOutcome, BenchResult (the ``bench --json`` record)
    prompts.py     prompt sets (JSONL — the card's {"id", "prompt"} too — or the built-in smoke set)
    ab.py          bench records against a baseline (``sparkserve ab diff``)
    ab_records.py  an A/B campaign's spec (drafters, cells, rounds, seeded ABBA order), waves, boots, pins
    ab_stats.py    bootstrap intervals over prompts and boots, deltas, KEEP/REVERT/TIE, the honest read
    ab_report.py   the table of record (``sparkserve ab report``): text, Markdown, JSON, ``--plot``

May import: ground (errors, config, journal, units), models/, plan/, observe/ and itself; never nodes/,
deploy/ or commands/. Network I/O lives only in run, scrape, client, completions and httpstream;
chat_template reads the tokenizer files it is given; metrics, stream, summary, records, ab and ab_* are
pure (``ab_report.plot`` writes the one file it is given).
"""
