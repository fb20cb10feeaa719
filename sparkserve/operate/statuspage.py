"""The status page: the stack, each gate with its evidence, acceptance per position as a chart, incidents and
recent history — one self-contained HTML document (no external asset: the page works on an air-gapped
Spark), rendered from :meth:`SuperviseState.snapshot`. It reloads itself every round.

A failing gate's row is red (class ``fail``), a passing one green (``ok``), one not judged grey (``na``).
A few lines of script write each gate row's computed colour into ``data-shown-color`` once the page has
rendered, so a headless browser's DOM dump says what a person sees.
"""

from __future__ import annotations

import html
import time
from typing import Any

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.2em 0 .4em}
table{border-collapse:collapse;width:100%} td,th{padding:.3em .5em;border-bottom:1px solid #ddd;text-align:left;
vertical-align:top;font-size:.92em}
tr.gate.ok{background:rgb(214,245,214)} tr.gate.fail{background:rgb(220,40,40);color:#fff}
tr.gate.na{background:rgb(235,235,235)}
.phase{display:inline-block;padding:.15em .6em;border-radius:.3em;background:#eee;font-weight:600}
.phase.gave_up,.phase.incident{background:rgb(220,40,40);color:#fff} .phase.watching{background:rgb(214,245,214)}
.ev{font-family:ui-monospace,monospace;font-size:.85em;white-space:pre-wrap;margin:0}
.hist span{display:inline-block;width:6px;height:14px;margin-right:1px}
.hist .ok{background:rgb(60,170,60)} .hist .fail{background:rgb(220,40,40)}
"""

SCRIPT = """
document.querySelectorAll('tr.gate').forEach(function(r){
  r.setAttribute('data-shown-color', getComputedStyle(r).backgroundColor);});
document.body.setAttribute('data-rendered', '1');
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _ago(t: float | None, now: float) -> str:
    return "never" if t is None else f"{now - t:.0f}s ago"


def _chart(live: list[float], band: list[float]) -> str:
    """Bars of live per-position acceptance, with the band's rate as a tick per position (inline SVG)."""
    n = max(len(live), len(band))
    if n == 0:
        return "<p>no acceptance figures yet (the window needs drafts)</p>"
    w, h, bw = 40 * n + 20, 160, 26
    parts = [f'<svg id="acceptance-chart" width="{w}" height="{h + 20}" role="img" '
             'aria-label="acceptance per position">']
    for i in range(n):
        x = 10 + i * 40
        if i < len(live):
            bh = max(0.0, min(1.0, live[i])) * h
            parts.append(f'<rect class="live" x="{x}" y="{h - bh:.1f}" width="{bw}" height="{bh:.1f}" '
                         f'fill="rgb(70,110,200)"><title>position {i}: {live[i]:.3f}</title></rect>')
        if i < len(band):
            y = h - max(0.0, min(1.0, band[i])) * h
            parts.append(f'<line x1="{x - 3}" x2="{x + bw + 3}" y1="{y:.1f}" y2="{y:.1f}" stroke="rgb(30,30,30)" '
                         'stroke-width="2"/>')
        parts.append(f'<text x="{x + 8}" y="{h + 15}" font-size="11">{i}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _replicas(s: dict[str, Any]) -> str:
    """A fleet's replicas (each one's phase, place in the router, failing gates) and its router; "" otherwise."""
    if not s.get("replicas"):
        return ""
    rows = []
    for r in s["replicas"]:
        bad = "; ".join(f"{k}: {g['summary']}" for k, g in r["gates"].items() if g["ok"] is False)
        rows.append(f"<tr class='gate {'ok' if r['ok'] else 'fail'}' id='replica-{_e(r['replica'])}'>"
                    f"<td><b>{_e(r['label'])}</b></td><td>{_e(r['phase'])}</td>"
                    f"<td>{'in the router' if r['in_router'] else 'OUT of the router'}</td>"
                    f"<td>{_e(bad or 'all gates pass')} · restarts {_e(r['restarts'])}</td></tr>")
    router = s.get("router") or {}
    return (f"<h2>Replicas</h2><p id='router'>router: {_e(router.get('summary', '—'))}</p>"
            f"<table id='replicas'><tr><th>replica</th><th>phase</th><th>router</th><th>gates</th></tr>"
            f"{''.join(rows)}</table>")


def render(s: dict[str, Any], *, refresh_s: float = 5.0, now: float | None = None) -> str:
    now = time.time() if now is None else now
    st = s["stack"]
    rows = []
    for name, g in s["gates"].items():
        cls = "ok" if g["ok"] is True else "fail" if g["ok"] is False else "na"
        ev = "".join(f"<pre class='ev'>{_e(x)}</pre>" for x in g.get("evidence") or [])
        rows.append(f"<tr class='gate {cls}' id='gate-{_e(name)}'><td><b>{_e(name)}</b></td>"
                    f"<td>{'PASS' if cls == 'ok' else 'FAIL' if cls == 'fail' else '—'}</td>"
                    f"<td>{_e(g['summary'])}{ev}</td></tr>")
    win, band = s.get("window"), s.get("band")
    live = list(win["per_position"]) if win else []
    bandp = list(band["per_position"]) if band else []
    al = f"{win['acceptance_length']:.2f}" if win and win.get("acceptance_length") else "—"
    bal = f"{band['acceptance_length']:.2f} ({_e(band['source'])})" if band else "not banked yet"
    inc = "".join(f"<tr><td>{_e(i.get('time'))}</td><td>{_e(', '.join(v['check'] for v in i.get('verdict', [])))}"
                  f"</td><td>{_e((i.get('verdict') or [{}])[0].get('summary', ''))}</td><td><code>{_e(i.get('dir'))}"
                  "</code></td></tr>" for i in reversed(s.get("incidents") or [])) or \
        "<tr><td colspan=4>none</td></tr>"
    hist = "".join(f"<span class='{'ok' if h.get('ok') else 'fail'}' title='{_e(h.get('summary', ''))}'></span>"
                   for h in s.get("history") or [])
    events = "".join(f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(e['time']))}</td><td>{_e(e['kind'])}</td>"
                     f"<td>{_e(e['text'])}</td></tr>" for e in (s.get("events") or [])[:20]) or \
        "<tr><td colspan=3>none</td></tr>"
    mem = ", ".join(f"{_e(k)} {v / 2**30:.1f} GiB" if v is not None else f"{_e(k)} ?"
                    for k, v in (s.get("memfree") or {}).items()) or "—"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>sparkserve supervise</title>
<meta http-equiv="refresh" content="{max(1, int(refresh_s))}"><style>{CSS}</style></head><body>
<h1>sparkserve supervise — {_e(st.get('served_name', '?'))}</h1>
<p><span class="phase {_e(s['phase'])}" id="phase">{_e(s['phase'])}</span>
 {_e(st.get('api_url', ''))} · nodes {_e(', '.join(st.get('nodes', [])))} · runtime {_e(st.get('runtime', ''))}
 · deployment <code>{_e(str(st.get('fingerprint') or '')[:12])}</code> · round {s['rounds']}
 ({_ago(s['last_round_at'], now)}) · restarts {s['restarts']} · incidents {len(s.get('incidents') or [])}</p>
{_replicas(s)}
<h2>Gates</h2><table id="gates"><tr><th>gate</th><th>verdict</th><th>evidence</th></tr>{''.join(rows)}</table>
<h2>Acceptance per position</h2><p>live acceptance length {al} · band {bal} · canary
 {f"{s['canary_s']:.2f}s" if s.get('canary_s') is not None else '—'} · MemFree {mem}</p>{_chart(live, bandp)}
<h2>Incidents</h2><table id="incidents"><tr><th>time</th><th>checks</th><th>verdict</th><th>dir</th></tr>{inc}</table>
<h2>Recent history</h2><div class="hist" id="history">{hist}</div>
<table id="events"><tr><th>time</th><th>what</th><th></th></tr>{events}</table>
<script>{SCRIPT}</script></body></html>"""
