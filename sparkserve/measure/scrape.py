"""The server's side of a cell over HTTP: its ``/metrics`` counters and the models it serves.

Example::

    async with httpx.AsyncClient(trust_env=False) as client:
        await check_model(client, "http://127.0.0.1:8000", "glm-5.3-flash", where)  # BadInput if not served
        before = await scrape(client, "http://127.0.0.1:8000", "glm-5.3-flash", where)

Both raise :class:`RemoteFailure` naming the URL when the server does not answer as vLLM does; the text
itself is read by :mod:`sparkserve.measure.metrics`.
"""

from __future__ import annotations

import httpx

from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.measure.metrics import MetricsError, Snapshot, parse_metrics

METRICS_PATH = "/metrics"
MODELS_PATH = "/v1/models"


async def scrape(client: httpx.AsyncClient, base_url: str, model: str | None, where: str) -> Snapshot:
    """One ``/metrics`` snapshot, counting only ``model``'s samples when given."""
    url = base_url + METRICS_PATH
    try:
        r = await client.get(url, timeout=30.0)
    except httpx.HTTPError as e:
        raise RemoteFailure(url, f"{where}: cannot scrape ({type(e).__name__}: {e or 'no answer'})") from e
    if r.status_code != 200:
        raise RemoteFailure(url, f"{where}: HTTP {r.status_code}")
    try:
        return parse_metrics(r.text, model_name=model)
    except MetricsError as e:
        raise RemoteFailure(url, str(e)) from e


async def check_model(client: httpx.AsyncClient, base_url: str, model: str, where: str) -> None:
    """Raise :class:`BadInput` unless ``/v1/models`` lists ``model`` (a bench of the wrong model is void)."""
    url = base_url + MODELS_PATH
    try:
        r = await client.get(url, timeout=30.0)
        ids = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise RemoteFailure(url, f"{where}: no model list ({type(e).__name__}: {e})") from e
    if ids is None:
        raise RemoteFailure(url, f"{where}: HTTP {r.status_code}")
    if model not in ids:
        raise BadInput("model.served_name", f"{where} serves {ids}, not {model!r}")
