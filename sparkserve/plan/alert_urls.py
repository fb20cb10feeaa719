"""Alert URLs without their credentials: what sparkserve may show or write of ``supervise.alert_urls``.

An apprise URL carries its secret in different places by scheme: the userinfo (``mailto://user:pass@host``,
``json://user:pass@host/path``, ``ntfys://token@host/topic``), the query (``?token=…``, ``?pass=…``), and —
for the chat services — the "host" and path themselves (``tgram://{bot_token}/{chat_id}``,
``slack://{tokenA}/{tokenB}/{tokenC}``, ``discord://{webhook_id}/{webhook_token}``). So:

    redact_url("mailto://me:hunter22@smtp.example.org")   # "mailto://smtp.example.org/…"
    redact_url("tgram://1234567:AAH…/987654")             # "tgram://<redacted>/…"
    url_secrets(urls)                                      # every secret part, to scrub any text of them

Only the scheme and (where it is not itself a token) the host are ever shown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

REDACTED = "<redacted>"

#: apprise schemes whose "host" and path are tokens or webhook ids (apprise's documented URL forms).
TOKEN_SCHEMES = frozenset({
    "tgram", "slack", "discord", "msteams", "pover", "pbul", "pushed", "gotify", "gotifys", "join", "kumulos",
    "line", "mailgun", "opsgenie", "pagerduty", "pushme", "pushy", "reddit", "ryver", "sendgrid", "simplepush",
    "spush", "twist", "twilio", "zulip", "signal", "signals", "lametric", "bark", "barks", "guilded", "workflow",
    "workflows", "flock", "gchat", "hooks", "o365", "azure", "ifttt", "webex", "wxteams", "revolt", "notica",
    "prowl", "pjet", "pjets", "fcm", "apprise", "apprises", "matrix", "matrixs",
})
SECRET_QUERY = ("token", "key", "pass", "secret", "auth", "webhook", "apikey", "access", "bearer", "sig")


def _split(url: str) -> tuple[str, str, str, str]:
    """(scheme, netloc, path, query) of an apprise URL, without urllib choking on a token in the port place."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", url, ""
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    return scheme.lower(), netloc, path, query


def redact_url(url: str) -> str:
    """``scheme://host/…`` — no userinfo, no path, no query; a token-host scheme shows no host either."""
    scheme, netloc, _, _ = _split(url)
    if not scheme:
        return REDACTED
    if scheme in TOKEN_SCHEMES:
        return f"{scheme}://{REDACTED}/…"
    host = netloc.rsplit("@", 1)[-1]
    try:
        host = urlsplit(f"x://{host}").hostname or REDACTED
    except ValueError:
        host = REDACTED
    return f"{scheme}://{host}/…"


def url_secrets(urls: Iterable[str]) -> set[str]:
    """Every secret part of each URL (and the URL itself), each as written and percent-decoded: what a text must
    be scrubbed of. Parts shorter than 4 characters are left out (they would scrub ordinary words)."""
    found: set[str] = set()
    for url in urls:
        scheme, netloc, path, query = _split(url)
        found.add(url)
        if not scheme:
            continue
        found.add(url.split("://", 1)[1])
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
            found.add(userinfo)
            user, _, password = userinfo.partition(":")
            found.update({password, user if len(user) >= 12 or not password else ""})
        if scheme in TOKEN_SCHEMES:
            found.add(netloc)
            found.update(netloc.split(":"))
            found.update(seg for seg in path.split("/") if seg)
            found.add(path)
        for k, v in parse_qsl(query, keep_blank_values=False):
            if any(s in k.lower() for s in SECRET_QUERY):
                found.add(v)
    found |= {unquote(s) for s in found}
    return {s for s in found if len(s) >= 4}


def scrub_text(text: str, secrets: set[str]) -> str:
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


class ScrubFilter(logging.Filter):
    """A logging filter that takes every secret out of a record (apprise's own log lines may quote a URL)."""

    def __init__(self, secrets: set[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except (TypeError, ValueError):
            msg = str(record.msg)
        record.msg, record.args = scrub_text(msg, self.secrets), None
        return True
