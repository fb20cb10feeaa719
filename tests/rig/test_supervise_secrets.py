"""No alert-URL credential in anything sparkserve writes for others to read (issue 31 item 5).

One alert URL of each of six common apprise schemes, each carrying a planted secret (a Telegram bot token, Slack
and Discord webhook tokens, an SMTP password, an ntfy access token, a JSON webhook's basic-auth password), in
``supervise.alert_urls`` of a one-node local stack (``runtime: process``, the engine emulator). The engine wedges,
the supervisor writes an incident and tries to alert every URL (apprise's HTTP goes to a closed port on
127.0.0.1 through ``HTTPS_PROXY``/``HTTP_PROXY``, SMTP and the others to 127.0.0.1 themselves: no traffic leaves the
machine); then `status`, `status --json`, the status page, ``/status.json`` and `bundle` are read. Every file the
incident and the bundle hold, the supervisor's log, each output, and every file under the state dir (the journal
among them) is searched for each secret: none may be found, and the redacted forms show scheme and host only.
"""

from __future__ import annotations

import signal
import tarfile
import time
import urllib.request
from pathlib import Path

from supervise_stack import LocalStack

from sparkserve.plan.alert_urls import redact_url

CLOSED = "127.0.0.1:9"  # discard: nothing listens here on the test machine
SECRETS = {
    "tgram": "AAHplantedTelegramBotToken9x7Q",
    "slack": "T1PLANTED/B2PLANTED/slackWebhookTokenPlanted42",
    "discord": "discordWebhookTokenPlanted_aZ9",
    "mailto": "smtpPasswordPlanted!77",
    "ntfy": "tk_ntfyAccessTokenPlanted31",
    "json": "jsonBasicAuthPlanted#5",
}
URLS = [
    f"tgram://7712345678:{SECRETS['tgram']}/987654321",
    f"slack://{SECRETS['slack']}/#alerts",
    f"discord://112233445566778899/{SECRETS['discord']}",
    f"mailto://sparkops:{SECRETS['mailto'].replace('!', '%21')}@{CLOSED}?to=ops@example.invalid",
    f"ntfy://{SECRETS['ntfy']}@{CLOSED}/sparkserve-alerts",
    f"json://hookuser:{SECRETS['json'].replace('#', '%23')}@{CLOSED}/hook",
]
# what each secret looks like as written in a URL and decoded, and the parts a leak might show alone
NEEDLES = sorted({*SECRETS.values(), "slackWebhookTokenPlanted42", "smtpPasswordPlanted%2177",
                  "jsonBasicAuthPlanted%235", "7712345678:AAH"})


def _leaks(name: str, data: bytes) -> list[str]:
    return [f"{n!r} in {name}" for n in NEEDLES if n.encode() in data]


def test_no_alert_url_secret_in_incident_bundle_logs_status_or_journal(tmp_path: Path) -> None:
    st = LocalStack.make(tmp_path, nodes=1, env={"SSEMU_CONTROL": str(tmp_path / "control")},
                         supervise={"recover": False, "alert_urls": URLS})
    proxy = {"HTTPS_PROXY": f"http://{CLOSED}", "HTTP_PROXY": f"http://{CLOSED}", "NO_PROXY": "",
             "https_proxy": f"http://{CLOSED}", "http_proxy": f"http://{CLOSED}", "no_proxy": ""}
    try:
        st.cli("up")
        sup = st.supervise(env=proxy)
        sup.wait_status(lambda s: s["gates"]["progress"]["ok"] is True, 15, "a passing canary")
        (tmp_path / "control").write_text("wedge@after=0\n")
        s = sup.wait_status(lambda s: s["incidents"], 30, "the wedge's incident")
        inc = Path(s["incidents"][-1]["dir"])
        time.sleep(3.0)  # the alerts are tried after the incident is recorded: let them fail and be said
        outputs: dict[str, bytes] = {}
        for path in ("/", "/status.json", "/metrics"):
            with urllib.request.urlopen(f"http://{st.listen}{path}", timeout=5) as r:
                outputs[f"page {path}"] = r.read()
        for args in (("status",), ("status", "--json")):
            p = st.cli(*args, check=False)
            assert p.returncode == 1, p.stdout  # the supervisor reports the wedge
            outputs[" ".join(args)] = (p.stdout + p.stderr).encode()
        bundle = tmp_path / "bundle.tar.gz"
        p = st.cli("bundle", "-o", str(bundle))
        outputs["bundle (its output)"] = (p.stdout + p.stderr).encode()
        assert sup.stop(signal.SIGTERM) == 0
        outputs["supervise log"] = sup.text().encode()
    finally:
        (tmp_path / "control").unlink(missing_ok=True)
        st.close()

    leaks: list[str] = []
    files = [f for f in inc.iterdir() if f.is_file()]
    assert {"incident.json", "metrics.txt"} <= {f.name for f in files}
    for f in files:
        leaks += _leaks(f"incident {f.name}", f.read_bytes())
    with tarfile.open(bundle) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert any(n.endswith("/config.yaml") for n in members)
    for name, data in members.items():
        leaks += _leaks(f"bundle {name}", data)
    for name, data in outputs.items():
        leaks += _leaks(name, data)
    state_files = [f for f in st.state.rglob("*") if f.is_file()]
    assert any(f.name.startswith("journal") for f in state_files)
    for f in state_files:
        leaks += _leaks(f"state {f.relative_to(st.state)}", f.read_bytes())
    assert leaks == []
    config_yaml = next(d for n, d in members.items() if n.endswith("/config.yaml")).decode()
    assert "alert_urls" in config_yaml and "<redacted>" in config_yaml  # the list is there, its secrets are not
    # the redacted forms: scheme and host only (a chat service's host is its token: none shown)
    assert [redact_url(u) for u in URLS] == [
        "tgram://<redacted>/…", "slack://<redacted>/…", "discord://<redacted>/…", f"mailto://{CLOSED.split(':')[0]}/…",
        f"ntfy://{CLOSED.split(':')[0]}/…", f"json://{CLOSED.split(':')[0]}/…"]
