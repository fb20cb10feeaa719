"""`sparkserve bench`, `history`, `ab` as a user runs them: real process, exit codes, stdout/stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _fake_vllm import SHORT, FakeState, FakeVllm

from sparkserve.config import default_yaml_text

REPO = Path(__file__).parents[2]


def sparkserve(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", *args], capture_output=True, text=True, timeout=timeout,
        env=env, cwd=env["HOME"],
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
    e.update(HOME=str(home), SSJOURNAL_PATH=str(tmp_path / "journal.sqlite"), COLUMNS="200",
             PYTHONPATH=str(REPO))
    return e


def write_config(path: Path, port: int, model: str = "fake-model") -> Path:
    text = (
        default_yaml_text()
        .replace("host: spark-a.lan", "host: 127.0.0.1")
        .replace("port: 8000", f"port: {port}")
        .replace("served_name: glm-5.3-flash", f"served_name: {model}")
    )
    assert f"port: {port}" in text and "host: 127.0.0.1" in text
    path.write_text(text)
    return path


def test_bench_smoke_from_config_json_contract_and_journal(env: dict[str, str], tmp_path: Path) -> None:
    with FakeVllm() as srv:
        cfg = write_config(tmp_path / "sparkserve.yaml", int(srv.url.rsplit(":", 1)[1]))
        p = sparkserve("bench", "--protocol", "forced", "--cell", "smoke", "--json", "-c", str(cfg), "--warmup", "0",
                       env=env)
        st = srv.state
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert (data["cell"], data["prompts"], data["concurrency"], data["max_tokens"]) == ("smoke", 20, 1, 512)
    assert data["requests_ok"] == 20 and data["stream_errors"] == 0 and data["output_tokens"] == 20 * 512
    assert data["drafts"] == st.drafts and data["node"] == "spark-a"
    assert p.stderr == ""  # --json: no progress bar
    h = sparkserve("history", "--json", env=env)
    assert h.returncode == 0, h.stderr
    [entry] = json.loads(h.stdout)["entries"]
    assert entry["kind"] == "bench" and entry["sha256_ok"] is True and entry["ok"] is True
    from sparkserve.config import load_config

    assert entry["fingerprint"] == load_config(cfg).fingerprint()  # no deployment recorded: the config's own


def test_bench_sends_the_configured_api_key(env: dict[str, str], tmp_path: Path) -> None:
    with FakeVllm(FakeState(api_key="s3cret")) as srv:
        cfg = write_config(tmp_path / "sparkserve.yaml", int(srv.url.rsplit(":", 1)[1]))
        cfg.write_text(cfg.read_text().replace("serve:\n", "serve:\n  api_key_env: BENCH_KEY\n", 1))
        p = sparkserve("bench", "--protocol", "forced", "--cell", "smoke", "--json", "-c", str(cfg),
                       env={**env, "BENCH_KEY": "s3cret"})
        assert p.returncode == 0, p.stderr
        bad = sparkserve("bench", "--protocol", "forced", "--cell", "smoke", "--json", "-c", str(cfg),
                         env={**env, "BENCH_KEY": "wrong"})
    assert bad.returncode == 1 and json.loads(bad.stdout)["error_kinds"] == {"http": 20}
    assert "HTTP 401" in json.loads(bad.stdout)["errors"][0]["detail"]


def test_bench_refused_cell_prints_json_and_exits_1_with_one_error_line(env: dict[str, str]) -> None:
    with FakeVllm(FakeState(modes=lambda i: SHORT if i == 0 else "ok")) as srv:
        p = sparkserve("bench", "--protocol", "forced", "--cell", "smoke", "--json", "--url", srv.url,
                       "--model", "fake-model", "--warmup", "0", env=env)
    assert p.returncode == 1
    data = json.loads(p.stdout)
    assert data["ok"] is False and data["incomplete"] == 1
    assert p.stderr.splitlines()[0] == (
        "error: bench smoke: refused: 1 forced-length replies came back short (shortest 256 of 512 tokens)"
    )
    assert "Traceback" not in p.stderr


def test_bench_human_output_and_progress(env: dict[str, str]) -> None:
    with FakeVllm() as srv:
        p = sparkserve("bench", "--protocol", "forced", "--cell", "smoke", "--url", srv.url, "--model", "fake-model",
                       env=env)
    assert p.returncode == 0, p.stderr
    assert "acceptance length" in p.stdout and "20 / 20" in p.stdout
    assert "20/20" in p.stderr  # the progress bar, on stderr


def test_bench_unreachable_server_exits_3(env: dict[str, str]) -> None:
    p = sparkserve("bench", "--protocol", "forced", "--cell", "smoke", "--url", "http://127.0.0.1:9", "--model", "m",
                   env=env)
    assert p.returncode == 3
    assert p.stderr.startswith("error: http://127.0.0.1:9/v1/models:") and "Traceback" not in p.stderr


def test_bench_bad_prompts_file_exits_2_naming_the_line(env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{oops\n')
    p = sparkserve("bench", "--cell", "c1", "--prompts", str(f), "--url", "http://127.0.0.1:9", env=env)
    assert p.returncode == 2
    assert p.stderr.startswith(f"error: {f}:2: not valid JSON")


def test_bench_rejects_unknown_cell(env: dict[str, str]) -> None:
    p = sparkserve("bench", "--cell", "c4", "--url", "http://127.0.0.1:9", env=env)
    assert p.returncode == 2 and "c4" in p.stderr


def _result(tmp_path: Path, name: str, **over: object) -> Path:
    base = {
        "cell": "c16", "prompts": 500, "concurrency": 16, "max_tokens": 1024, "requests_ok": 500,
        "stream_errors": 0, "output_tokens": 512000, "duration_s": 100.0, "output_tok_s": 5120.0,
        "acceptance_length": 3.5, "per_position_acceptance": [0.8, 0.6, 0.5, 0.3, 0.2, 0.1, 0.0],
        "drafts": 1000, "draft_tokens": 7000, "accepted_tokens": 2500, "acceptance_rate": 2500 / 7000,
    }
    base.update(over)
    p = tmp_path / name
    p.write_text(json.dumps(base))
    return p


def test_ab_table_of_record_with_relative_deltas(env: dict[str, str], tmp_path: Path) -> None:
    a = _result(tmp_path, "a.json")
    b = _result(tmp_path, "b.json", output_tok_s=5632.0, acceptance_length=3.85,
                per_position_acceptance=[0.88, 0.6, 0.5, 0.3, 0.2, 0.1, 0.0])
    p = sparkserve("ab", str(a), str(b), "--json", env=env)
    assert p.returncode == 0, p.stderr
    t = json.loads(p.stdout)
    assert t["baseline"] == str(a) and t["cell"] == "c16"
    rb = t["rows"][1]
    assert rb["output_tok_s_delta"] == pytest.approx(0.10)
    assert rb["acceptance_length_delta"] == pytest.approx(0.10)
    assert rb["per_position_delta"][0] == pytest.approx(0.10) and rb["per_position_delta"][-1] is None
    assert t["rows"][0]["output_tok_s_delta"] == 0.0
    human = sparkserve("ab", str(a), str(b), env=env)
    assert human.returncode == 0 and "+10.0%" in human.stdout


def test_ab_refuses_unlike_cells(env: dict[str, str], tmp_path: Path) -> None:
    a = _result(tmp_path, "a.json")
    b = _result(tmp_path, "b.json", cell="c1", prompts=100, concurrency=1)
    p = sparkserve("ab", str(a), str(b), env=env)
    assert p.returncode == 2
    assert p.stderr.startswith(f"error: {b}: cell c1 (100×c1×1024) differs from the baseline")


def test_ab_bad_file_is_bad_input(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"cell": "c1"}')
    p = sparkserve("ab", str(_result(tmp_path, "a.json")), str(bad), env=env)
    assert p.returncode == 2
    assert p.stderr.startswith(f"error: {bad}: not a bench result: prompts: Field required")


def test_ab_marks_refused_results(env: dict[str, str], tmp_path: Path) -> None:
    a = _result(tmp_path, "a.json")
    b = _result(tmp_path, "b.json", ok=False, refused=["contaminated: x"])
    p = sparkserve("ab", str(a), str(b), "--json", env=env)
    rows = json.loads(p.stdout)["rows"]
    assert [r["ok"] for r in rows] == [True, False]


def test_history_empty_journal(env: dict[str, str]) -> None:
    p = sparkserve("history", env=env)
    assert p.returncode == 0, p.stderr
    assert "journal" in p.stdout
    pj = sparkserve("history", "--json", "--limit", "5", env=env)
    assert json.loads(pj.stdout)["entries"] == []
