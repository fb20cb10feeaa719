"""Day 2: keep a serving stack honest — `sparkserve supervise`, its checks, incidents, bounded recovery,
the exporter and status page, and the systemd service that runs it.

May import: every lower stage but campaign (deploy, image, nodes, measure, observe, plan, models, ground).
deploy/ is the boot and stays so: restarts go through :func:`sparkserve.deploy.stack.down` and the
`sparkserve up` command (a child process: the normal path, gates included); a replica's through its own
`deploy.stack.down` and `deploy.up.up`, the router's through `deploy.replicas.restart_router`.

    checks     pure: round facts → one verdict per check (progress, wedge, ranks, faults, kernel, memory,
               acceptance); state: what the supervisor knows now (the exporter, page and --json read it)
    nodefacts  the one node-side program per round: memory, kernel lines, rank pids, py-spy dumps
    probes     the canary generation and the /metrics scrape; the banked band; an incident's /metrics
    incident   forensics before any action: the incident directory, journalled
    recovery   the policy (backoff, give-up budget, pure) and its actions (graceful down, `up`, gates)
    loop       the supervisor of one stack: rounds, sd_notify, SIGTERM
    fleet      `replicas: N`: each replica's supervisor, the router watched and restarted first, a failing
               replica out of the router before its restart and back after its gates, one restart at a time
    exporter   Prometheus series + the status page on one port; statuspage renders it
    alerts     apprise; sdnotify (and the watchdog heartbeat); service (systemd unit); dashboard (Grafana JSON)
    bundle     `sparkserve bundle`: one tar.gz for a bug report, secrets scrubbed
"""
