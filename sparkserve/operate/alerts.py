"""Alerts on incident, recovery and give-up, through notification URLs (the ``apprise`` package: Slack,
Discord, ntfy, mail, ``json://`` webhooks …). Never raises: an alert that cannot be sent is said on stderr
and the supervisor goes on.

    send(["ntfy://my-topic", "json://127.0.0.1:9000/hook"], "sparkserve: gave up", body, level="failure")
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Literal

from sparkserve.plan.alert_urls import ScrubFilter, redact_url, scrub_text, url_secrets

Level = Literal["info", "success", "warning", "failure"]


def send(urls: Sequence[str], title: str, body: str, *, level: Level = "warning") -> bool:
    """Notify every URL; True when all of them took it (and when there are none)."""
    if not urls:
        return True
    try:
        import apprise
    except ImportError:
        print("warning: supervise: alerts need the apprise package (pip install apprise)", file=sys.stderr)
        return False
    secrets = url_secrets(urls)
    log = logging.getLogger("apprise")  # apprise's own lines may quote a URL: scrubbed before any handler sees them
    if not any(isinstance(f, ScrubFilter) for f in log.filters):
        log.addFilter(ScrubFilter(secrets))
    ap = apprise.Apprise()
    for u in urls:
        if not ap.add(u):
            print(f"warning: supervise: alert URL not understood by apprise: {redact_url(u)}", file=sys.stderr)
    kind = {"info": apprise.NotifyType.INFO, "success": apprise.NotifyType.SUCCESS,
            "warning": apprise.NotifyType.WARNING, "failure": apprise.NotifyType.FAILURE}[level]
    try:
        ok = bool(ap.notify(title=title, body=body, notify_type=kind))
    except Exception as e:  # noqa: BLE001 - a notification service's failure must never stop the supervisor
        print(f"warning: supervise: alert not sent: {type(e).__name__}: {scrub_text(str(e), secrets)}",
              file=sys.stderr)
        return False
    if not ok:
        print("warning: supervise: an alert was not delivered to every URL", file=sys.stderr)
    return ok
