"""The engine emulator's CLI, OpenAI API, /metrics and acceptance sampling, run as a plain host process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EMU = HERE / "emulator" / "vllm_emulator.py"
sys.path.insert(0, str(HERE / "emulator"))
sys.path.insert(0, str(HERE.parent / "helpers"))

import runner  # noqa: E402
import tiny_models  # noqa: E402
import vllm_emulator as emu  # noqa: E402

pytestmark = pytest.mark.rig
PROFILE = [0.744, 0.545, 0.405, 0.306, 0.237, 0.185, 0.147]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    tiny_models.write_target(d / "target")
    tiny_models.write_drafter(d / "drafter")
    return d


def start(models: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, str(EMU), "serve", str(models / "target"), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "65536",
            "--kv-cache-memory-bytes", "1G", "--kv-cache-dtype", "fp8_e4m3",
            "--speculative-config", json.dumps({"method": "dflash", "model": str(models / "drafter"),
                                                "num_speculative_tokens": 7}), *extra]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "SSEMU_BOOT_SECONDS": "0.3", **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        runner.wait_ready(url, timeout=30, alive=lambda: p.poll() is None)
    except runner.RunnerError:
        p.kill()
        raise AssertionError(p.stdout.read().decode()[-2000:] + p.stderr.read().decode()[-2000:]) from None
    return p, url


def stop(p: subprocess.Popen) -> tuple[str, str]:
    p.terminate()
    out, err = p.communicate(timeout=20)
    return out.decode(), err.decode()


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[str]:
    p, url = start(models, env={"SSEMU_TOKEN_RATE": "0", "SSEMU_SEED": "3"})
    yield url
    stop(p)


def post(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    import http.client
    import urllib.parse

    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data or b"{}")


def metrics(url: str) -> dict[str, float]:
    st, body = runner.http_get(url, "/metrics")
    assert st == 200
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def test_version_says_it_is_the_emulator() -> None:
    p = subprocess.run([sys.executable, str(EMU), "--version"], capture_output=True, text=True)
    assert p.returncode == 0
    assert p.stdout.startswith("0.33.0 ") and "not vLLM" in p.stdout


def test_unknown_option_fails_like_vllms_parser() -> None:
    p = subprocess.run([sys.executable, str(EMU), "serve", "/m", "--foo-bar", "3"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.endswith("vllm: error: unrecognized arguments: --foo-bar 3\n")
    assert p.stderr.startswith("usage: vllm [-h] [-v]\n")


def test_bad_value_fails_in_the_serve_parser() -> None:
    p = subprocess.run([sys.executable, str(EMU), "serve", "/m", "-tp", "abc"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr == ("usage: vllm serve [model_tag] [options]\n"
                        "vllm serve: error: argument --tensor-parallel-size/-tp: invalid int value: 'abc'\n")


def test_every_real_serve_option_parses() -> None:
    spec = emu._serve_args_json()
    parser = emu.build_serve_parser(spec)
    # each option string of vLLM 0.33.0 is known (abbreviations and --x_y spellings as vLLM accepts them)
    ns, extra = parser.parse_known_args(emu.normalize_argv(
        ["/m", "--enable-expert", "--kv-cache-memory=8G", "--max_model_len", "32k", "-O3", "-cc.cudagraph_mode=FULL",
         "--disable-log-stats"], {s for o in spec["options"] for s in o["option_strings"]}))
    assert extra == []
    assert ns.enable_expert_parallel is True and ns.kv_cache_memory_bytes == 8 * 2**30
    assert ns.max_model_len == 32000 and ns.optimization_level == "3"
    assert ns.compilation_config == {"cudagraph_mode": "FULL"} and ns.disable_log_stats is True
    assert len({s for o in spec["options"] for s in o["option_strings"]}) == spec["num_option_strings"] - 0


def test_kv_pool_matches_the_real_capture() -> None:
    target = {"num_hidden_layers": 4, "num_key_value_heads": 2, "num_attention_heads": 4, "hidden_size": 256,
              "torch_dtype": "bfloat16"}
    drafter = {"num_hidden_layers": 1, "num_key_value_heads": 2, "num_attention_heads": 4, "hidden_size": 256}
    fp8 = emu.kv_cache_plan(target, drafter, kv_bytes=2**30, kv_cache_dtype="fp8_e4m3", tp=2, max_model_len=4096)
    bf16 = emu.kv_cache_plan(target, drafter, kv_bytes=2**30, kv_cache_dtype="auto", tp=2, max_model_len=4096)
    assert (fp8.tokens, f"{fp8.max_concurrency:.2f}") == (1_677_712, "409.60")  # A-head.log
    assert (bf16.tokens, f"{bf16.max_concurrency:.2f}") == (838_848, "204.80")  # B-head.log


def test_models_and_health(server: str) -> None:
    assert runner.http_get(server, "/health")[0] == 200
    st, body = runner.http_get(server, "/v1/models")
    data = json.loads(body)["data"]
    assert st == 200 and data[0]["id"] == "tiny" and data[0]["max_model_len"] == 65536
    assert json.loads(runner.http_get(server, "/version")[1]) == {"version": "0.33.0"}


def test_completion_honours_max_tokens_and_reports_usage(server: str) -> None:
    st, r = post(server, "/v1/completions", {"model": "tiny", "prompt": "one two three", "max_tokens": 37})
    assert st == 200 and r["object"] == "text_completion"
    assert r["usage"] == {"prompt_tokens": 3, "total_tokens": 40, "completion_tokens": 37,
                          "prompt_tokens_details": None}
    assert r["choices"][0]["finish_reason"] == "length"
    assert len(r["choices"][0]["text"].split()) == 37


def test_stream_with_usage(server: str) -> None:
    text, usage, _ = runner.stream_completion(server, "tiny", "hello", max_tokens=50)
    assert usage["completion_tokens"] == 50 and len(text.split()) == 50
    text, usage, _ = runner.stream_completion(server, "tiny", "hello", max_tokens=20, chat=True)
    assert usage["completion_tokens"] == 20 and usage["prompt_tokens"] > 1


def test_temperature_zero_is_deterministic(server: str) -> None:
    a = post(server, "/v1/completions", {"prompt": "same", "max_tokens": 16, "temperature": 0})[1]
    b = post(server, "/v1/completions", {"prompt": "same", "max_tokens": 16, "temperature": 0})[1]
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_chat_template_kwargs_enable_thinking(server: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    plain = post(server, "/v1/chat/completions", body)[1]["choices"][0]["message"]
    think = post(server, "/v1/chat/completions", {**body, "chat_template_kwargs": {"enable_thinking": True}})[1]
    msg = think["choices"][0]["message"]
    assert plain["reasoning_content"] is None
    assert msg["reasoning_content"] and "<think>" not in msg["content"]


def test_bad_requests(server: str) -> None:
    st, r = post(server, "/v1/completions", {"model": "other", "prompt": "x"})
    assert st == 404 and r["error"]["message"] == "The model `other` does not exist."
    st, r = post(server, "/v1/completions", {"prompt": "x", "top_p": 0})
    assert st == 400 and r["error"]["type"] == "BadRequestError"
    st, r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 70000})
    assert st == 400 and "maximum context length is 65536" in r["error"]["message"]


def test_acceptance_follows_the_profile(server: str) -> None:
    before = metrics(server)
    for _ in range(20):
        post(server, "/v1/completions", {"prompt": "bench", "max_tokens": 512, "ignore_eos": True})
    after = metrics(server)
    lab = '{engine="0",model_name="tiny"}'

    def d(name: str, labels: str = lab) -> float:
        return after[f"vllm:{name}{labels}"] - before.get(f"vllm:{name}{labels}", 0.0)

    drafts, accepted = d("spec_decode_num_drafts_total"), d("spec_decode_num_accepted_tokens_total")
    assert d("spec_decode_num_draft_tokens_total") == 7 * drafts
    per_pos = [d("spec_decode_num_accepted_tokens_per_pos_total",
                 f'{{engine="0",model_name="tiny",position="{p}"}}') for p in range(7)]
    assert sum(per_pos) == accepted
    rates = [x / drafts for x in per_pos]
    assert all(abs(r - e) < 0.04 for r, e in zip(rates, PROFILE, strict=True)), rates
    assert rates == sorted(rates, reverse=True)
    assert d("generation_tokens_total") == 20 * 512
    assert abs((1 + accepted / drafts) - (1 + sum(PROFILE))) < 0.15
    assert after['vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"}'] >= 20
    assert 'vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"}' in after
    assert after["process_start_time_seconds"] > 1e9


def test_min_tokens_and_ignore_eos_with_a_natural_end(models: Path) -> None:
    p, url = start(models, env={"SSEMU_TOKEN_RATE": "0", "SSEMU_EOS_AFTER": "10"})
    try:
        r = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 100})[1]
        assert r["usage"]["completion_tokens"] == 10 and r["choices"][0]["finish_reason"] == "stop"
        r = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 100, "min_tokens": 30})[1]
        assert r["usage"]["completion_tokens"] == 30
        r = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 100, "ignore_eos": True})[1]
        assert r["usage"]["completion_tokens"] == 100 and r["choices"][0]["finish_reason"] == "length"
    finally:
        stop(p)


def test_api_key_protects_v1_but_not_health(models: Path) -> None:
    p, url = start(models, "--api-key", "s3cret")
    try:
        assert runner.http_get(url, "/health")[0] == 200
        assert post(url, "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 401
        st, _ = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 2}, {"Authorization": "Bearer s3cret"})
        assert st == 200
    finally:
        stop(p)


def test_stream_rate_is_configurable_and_fast(models: Path) -> None:
    p, url = start(models, env={"SSEMU_TOKEN_RATE": "0"})
    try:
        t0 = time.monotonic()
        _, usage, tps = runner.stream_completion(url, "tiny", "go", max_tokens=40000, ignore_eos=True, timeout=120)
        assert usage["completion_tokens"] == 40000
        assert tps >= 20000, f"{tps:.0f} tok/s"
        print(f"\nemulator stream: {tps:,.0f} tok/s ({time.monotonic() - t0:.2f}s for 40k tokens)")
    finally:
        stop(p)
    p, url = start(models, env={"SSEMU_TOKEN_RATE": "500"})
    try:
        _, usage, tps = runner.stream_completion(url, "tiny", "go", max_tokens=250, ignore_eos=True)
        assert 350 < tps < 520, tps
    finally:
        stop(p)


def test_a_client_that_resets_its_connection_leaves_no_traceback(models: Path) -> None:
    """uvicorn drops a connection the client reset; a ``socketserver`` traceback on stderr is a line no vLLM
    format produces (it made test_faults flaky: the client resets a keep-alive connection after an error event)."""
    import struct

    p, url = start(models, env={"SSEMU_TOKEN_RATE": "0"})
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 64, "stream": True}).encode()
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.recv(64)  # the response has started; most of it is still unread
        time.sleep(0.2)  # the server finished writing and waits for the next keep-alive request
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close → RST
        s.close()
    time.sleep(0.3)
    assert runner.stream_completion(url, "tiny", "still serving", max_tokens=4)
    _, err = stop(p)
    assert "Traceback" not in err and "Exception occurred during processing of request" not in err, err[-2000:]
