"""The model card's bench protocol (`bench --protocol card`, issue 21 item 5).

The facts it must reproduce come from the card's drafter/eval/holdout_client.py: the prompt rendered
client-side through the target's chat template (one user turn, add_generation_prompt, enable_thinking),
POST /v1/completions {model, prompt, max_tokens, temperature 1.0, top_p 0.95} and nothing else (no forced
length: EOS ends a request), fixed concurrency, the first N prompts, acceptance from /metrics deltas summed
over labels, tok/s = Σ usage.completion_tokens / wall.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_bench_emulator import MODEL, StartEmu, emulator, models  # noqa: F401  (fixtures)
from test_cli_measure import env, sparkserve  # noqa: F401  (fixture)

from sparkserve.errors import BadInput
from sparkserve.measure.chat_template import ChatTemplate, TemplateError, load_chat_template
from sparkserve.measure.completions import card_body
from sparkserve.measure.metrics import acceptance, counter_delta, parse_metrics
from sparkserve.measure.prompts import PromptSet, parse_prompts
from sparkserve.measure.records import CARD_SAMPLING, CELLS, Cell
from sparkserve.measure.run import render_prompts, run_cell, run_cell_outcomes_async
from sparkserve.measure.summary import summarize

# The chat template of tests/real/gen_models.py's tiny Qwen3 target: the one the real-GPU run serves and
# renders (tokenizer_config.json / chat_template.jinja as transformers' save_pretrained writes them).
QWEN_TINY = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
             "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}")

# A template in the GLM family's style, written for this test: a BOS token, a system prefix, raise_exception
# on a bad role, loop controls, tojson, a namespace, whitespace control with trim/lstrip blocks.
GLM_STYLE = """[gMASK]<sop>
{%- set ns = namespace(n=0) -%}
{%- for m in messages %}
{%- if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}
{%- if m.role == 'system' %}{% continue %}{% endif %}
{%- set ns.n = ns.n + 1 %}
<|{{ m.role }}|>{{ m.content }}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>{{ '<think>' if enable_thinking else '</think>' }}
{%- endif %}
{%- if meta is defined %}{{ meta | tojson }}{% endif %}"""


def _tok_dir(tmp_path: Path, template: Any, *, jinja: str | None = None, **cfg: Any) -> Path:
    d = tmp_path / "tok"
    d.mkdir(exist_ok=True)
    body = {"eos_token": "<|endoftext|>", **cfg}
    if template is not None:
        body["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(body))
    if jinja is not None:
        (d / "chat_template.jinja").write_text(jinja)
    return d


# -- rendering --------------------------------------------------------------------------------------------


def test_renders_the_tiny_qwen3_template_as_the_card_client_does(tmp_path: Path) -> None:
    tpl = load_chat_template(_tok_dir(tmp_path, QWEN_TINY))
    assert tpl.render_user("Find x.") == "<|im_start|>user\nFind x.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tpl.render_user("Find x.", enable_thinking=False).endswith("<|im_start|>assistant\n")
    assert tpl.source.endswith("tokenizer_config.json") and len(tpl.sha256) == 64


def test_glm_style_template_trim_blocks_loop_controls_tojson_and_bos(tmp_path: Path) -> None:
    tpl = load_chat_template(_tok_dir(tmp_path, GLM_STYLE))
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    # "{%-" eats the whitespace (newlines too) before each tag, trim_blocks the newline after one: the lines join
    got = tpl.render(msgs, add_generation_prompt=True, enable_thinking=True)
    assert got == "[gMASK]<sop><|user|>hi<|assistant|><think>"
    out = tpl.render([{"role": "user", "content": "q"}], add_generation_prompt=False, meta={"é": [1, 2]})
    assert out == '[gMASK]<sop><|user|>q{"é": [1, 2]}'  # tojson keeps non-ASCII, as transformers' does
    with pytest.raises(TemplateError, match="bad role tool"):
        tpl.render([{"role": "tool", "content": "x"}])


def test_chat_template_jinja_wins_and_special_tokens_reach_the_template(tmp_path: Path) -> None:
    d = _tok_dir(tmp_path, "from-config",
                 jinja="{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ messages[0].content }}",
                 bos_token={"__type": "AddedToken", "content": "<s>"}, pad_token=None)
    (d / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<pad>", "eos_token": "<ignored>"}))
    tpl = load_chat_template(d)
    assert tpl.source.endswith("chat_template.jinja")
    assert tpl.render_user("p") == "<s>|<|endoftext|>|<pad>|p"  # tokenizer_config first, then the map


def test_named_templates_use_default_and_a_file_path_works(tmp_path: Path) -> None:
    d = _tok_dir(tmp_path, [{"name": "tool_use", "template": "T"},
                            {"name": "default", "template": "D{{ messages|length }}"}])
    assert load_chat_template(d).render_user("x") == "D1"
    assert load_chat_template(d / "tokenizer_config.json").render_user("x") == "D1"
    j = tmp_path / "t.jinja"
    j.write_text("J:{{ messages[0].content }}")
    assert load_chat_template(j).render_user("x") == "J:x"


def test_unusable_templates_are_bad_input_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no chat template"):
        load_chat_template(_tok_dir(tmp_path, None))
    d = _tok_dir(tmp_path, "{% for x in %}")
    with pytest.raises(BadInput) as e:
        load_chat_template(d)
    assert e.value.where == str(d / "tokenizer_config.json") and "does not compile" in e.value.what
    with pytest.raises(BadInput, match="does not exist"):
        load_chat_template(tmp_path / "nope")
    with pytest.raises(BadInput, match="no \"default\""):
        load_chat_template(_tok_dir(tmp_path, [{"name": "tool_use", "template": "T"}]))


def test_a_template_that_raises_on_a_prompt_is_refused_before_any_request() -> None:
    tpl = ChatTemplate(source="/t/tokenizer_config.json",
                       template="{% if 'forbidden' in messages[0].content %}{{ raise_exception('no') }}{% endif %}ok")
    ps = parse_prompts('{"id": "a-1", "prompt": "fine"}\n{"id": "b-2", "prompt": "forbidden"}\n', "p.jsonl")
    assert render_prompts(tpl, ps, 1, CARD_SAMPLING) == ["ok"]
    with pytest.raises(BadInput) as e:
        render_prompts(tpl, ps, 2, CARD_SAMPLING)
    assert e.value.where == "/t/tokenizer_config.json" and "prompt b-2" in e.value.what


def test_the_cards_prompt_file_shape_is_read_with_ids() -> None:
    ps = parse_prompts('{"id": "openr1math-007026", "source": "openr1math", "prompt": "9. Find"}\n', "h.jsonl")
    assert ps[0].id == "openr1math-007026" and ps[0].messages == [{"role": "user", "content": "9. Find"}]


# -- the request body ---------------------------------------------------------------------------------------


def test_card_body_is_the_holdout_clients_and_nothing_else() -> None:
    b = card_body("glm-5.3-flash", "<rendered>", 1024)
    assert b == {"model": "glm-5.3-flash", "prompt": "<rendered>", "max_tokens": 1024, "temperature": 1.0,
                 "top_p": 0.95}
    assert CARD_SAMPLING.protocol == "card" and CARD_SAMPLING.forced_length is False


# -- the metric deltas ---------------------------------------------------------------------------------------


def _metrics(drafts: tuple[float, float], dtok: tuple[float, float], acc: tuple[float, float],
             per_pos: list[tuple[float, float]], gen: float = 0, ok: float = 0, boot: float = 1.0) -> str:
    """Two engines (DP labels), as vLLM exports them: the card sums every label set."""
    lines = [f"process_start_time_seconds {boot}"]
    for e in (0, 1):
        lab = f'engine="{e}",model_name="m"'
        lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts[e]}",
                  f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {dtok[e]}",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {acc[e]}",
                  f"vllm:generation_tokens_total{{{lab}}} {gen / 2}",
                  f'vllm:request_success_total{{{lab},finished_reason="stop"}} {ok / 2}']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {v[e]}'
                  for p, v in enumerate(per_pos)]
    return "\n".join(lines) + "\n"


def test_acceptance_is_the_cards_formulas_over_deltas_summed_over_labels() -> None:
    before = parse_metrics(_metrics((10, 20), (70, 140), (5, 5), [(3, 3), (2, 2)]))
    after = parse_metrics(_metrics((110, 120), (770, 840), (185, 145), [(90, 80), (65, 55)]))
    fig = acceptance(counter_delta(before, after))
    drafts, dtok, acc = 200, 1400, 320  # (100 + 100), (700 + 700), (180 + 140)
    assert (fig.drafts, fig.draft_tokens, fig.accepted_tokens) == (drafts, dtok, acc)
    assert fig.acceptance_length == pytest.approx(1 + acc / drafts)  # mean acceptance length
    assert fig.acceptance_rate == pytest.approx(acc / dtok)  # draft-token acceptance rate
    assert fig.per_position == pytest.approx([(87 + 77) / drafts, (63 + 53) / drafts])  # accepted_at_pos / drafts


def test_k_is_read_from_the_counters_and_the_k4_cell_refuses_another_k() -> None:
    before = parse_metrics(_metrics((0, 0), (0, 0), (0, 0), [(0, 0)] * 7))
    after = parse_metrics(_metrics((50, 50), (350, 350), (100, 100), [(40, 40), (30, 30), (20, 20), (10, 10),
                                                                        (0, 0), (0, 0), (0, 0)], gen=300, ok=4))
    from sparkserve.measure.records import RequestOutcome

    outs = [RequestOutcome(index=i, completion_tokens=75) for i in range(4)]
    ok = summarize(Cell("c16", 4, 2, 128), outs, 1.0, before, after, sampling=CARD_SAMPLING)
    assert ok.ok and ok.k == 7 and ok.protocol == "card"
    k4 = summarize(CELLS["c16-k4"], outs, 1.0, before, after, sampling=CARD_SAMPLING)
    assert not k4.ok and "is for K=4" in k4.refused[0] and "drafted 7" in k4.refused[0]


# -- on the wire: a recording server ---------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: list[dict[str, Any]] = []
    paths: list[str] = []
    generated = 0
    finished = 0
    lock = threading.Lock()

    def log_message(self, *a: Any) -> None:
        return None

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "m"}]}).encode())
            return
        c = type(self)
        g, f = c.generated, c.finished
        text = (f"vllm:spec_decode_num_drafts_total {g / 2}\nvllm:spec_decode_num_draft_tokens_total {g * 3.5}\n"
                f"vllm:spec_decode_num_accepted_tokens_total {g / 2}\n"
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {g / 2}\n'
                f"vllm:generation_tokens_total {g}\nvllm:request_success_total {f}\n")
        self._send(text.encode(), "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        c = type(self)
        n = 10 + len(body["prompt"]) % 7  # EOS well before max_tokens: a natural end, not a forced length
        with c.lock:
            c.bodies.append(body)
            c.paths.append(self.path)
            c.generated += n
            c.finished += 1
        self._send(json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}}).encode())


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.bodies, _Recorder.paths, _Recorder.generated, _Recorder.finished = [], [], 0, 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_on_the_wire_the_first_n_rendered_prompts_go_to_completions_with_the_cards_body(recorder: str) -> None:
    ps = parse_prompts("".join(json.dumps({"id": f"h{i}", "prompt": f"question {i}"}) + "\n" for i in range(9)), "h")
    tpl = ChatTemplate(source="t", template=QWEN_TINY)
    r, outs = asyncio.run(run_cell_outcomes_async(recorder, "m", Cell("c16", 6, 3, 256),
                                                  PromptSet("h.jsonl", "0" * 64, ps), sampling=CARD_SAMPLING,
                                                  template=tpl))
    assert set(_Recorder.paths) == {"/v1/completions"} and len(_Recorder.bodies) == 6
    assert all(set(b) == {"model", "prompt", "max_tokens", "temperature", "top_p"} for b in _Recorder.bodies)
    assert all(b["max_tokens"] == 256 and b["temperature"] == 1.0 and b["top_p"] == 0.95 for b in _Recorder.bodies)
    assert sorted(b["prompt"] for b in _Recorder.bodies) == sorted(tpl.render_user(f"question {i}") for i in range(6))
    assert r.ok and r.protocol == "card" and r.endpoint == "/v1/completions" and r.incomplete == 0
    assert r.output_tokens == sum(o.completion_tokens for o in outs) == _Recorder.generated
    assert r.output_tok_s == pytest.approx(r.output_tokens / r.duration_s, rel=1e-3)
    assert {o.finish_reason for o in outs} == {"stop"} and all(o.completion_tokens < 256 for o in outs)


def test_fewer_prompts_than_the_cell_runs_them_once_with_a_warning(recorder: str) -> None:
    ps = parse_prompts('{"prompt": "a"}\n{"prompt": "b"}\n', "h")
    r = run_cell(recorder, "m", Cell("c16", 5, 2, 64), PromptSet("h.jsonl", "0" * 64, ps), sampling=CARD_SAMPLING,
                 template=ChatTemplate(source="t", template=QWEN_TINY))
    assert r.prompts == 2 and len(_Recorder.bodies) == 2
    assert any("holds 2 prompts" in w for w in r.warnings)


def test_the_card_protocol_without_a_template_is_bad_input(recorder: str) -> None:
    with pytest.raises(BadInput) as e:
        run_cell(recorder, "m", Cell("c16", 1, 1, 8), PromptSet("h", "0" * 64, parse_prompts('{"prompt": "a"}', "h")),
                 sampling=CARD_SAMPLING)
    assert e.value.where == "--chat-template" and _Recorder.bodies == []


# -- end to end on the engine emulator ---------------------------------------------------------------------


def test_card_protocol_end_to_end_on_the_emulator_eos_ends_requests(emulator: StartEmu, tmp_path: Path) -> None:  # noqa: F811
    emu = emulator({"SSEMU_EOS_AFTER": "20-120"})
    tpl = load_chat_template(_tok_dir(tmp_path, QWEN_TINY))
    ps = parse_prompts("".join(json.dumps({"id": i, "prompt": f"holdout {i}"}) + "\n" for i in range(24)), "h")
    r, outs = asyncio.run(run_cell_outcomes_async(emu.url, MODEL, Cell("c16", 24, 4, 96),
                                                  PromptSet("h.jsonl", "0" * 64, ps), sampling=CARD_SAMPLING,
                                                  template=tpl))
    assert r.ok, r.refused
    stops = [o for o in outs if o.finish_reason == "stop"]
    assert stops and all(o.completion_tokens < 96 for o in stops)  # EOS ended these, not max_tokens
    assert any(o.finish_reason == "length" and o.completion_tokens == 96 for o in outs)
    assert len({o.completion_tokens for o in outs}) > 3  # lengths vary: nothing forced them
    assert r.output_tokens == sum(o.completion_tokens for o in outs)  # Σ usage.completion_tokens
    assert r.k == 7 and len(r.per_position_acceptance) == 7
    assert r.acceptance_length == pytest.approx(1 + r.accepted_tokens / r.drafts, abs=1e-6)
    assert sum(r.per_position_acceptance) == pytest.approx(r.acceptance_length - 1, abs=1e-4)


def test_cli_bench_card_json_and_journal_say_which_protocol_ran(emulator: StartEmu, tmp_path: Path,  # noqa: F811
                                                                env: dict[str, str]) -> None:  # noqa: F811
    emu = emulator({"SSEMU_EOS_AFTER": "10-60"})
    tok = _tok_dir(tmp_path, QWEN_TINY)
    prompts = tmp_path / "holdout.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"p {i}"}) + "\n" for i in range(10)))
    p = sparkserve("bench", "--cell", "smoke", "--size", "8x2x64", "--prompts", str(prompts), "--chat-template",
                   str(tok), "--url", emu.url, "--model", MODEL, "--json", env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["protocol"], d["endpoint"], d["sampling"]["protocol"]) == ("card", "/v1/completions", "card")
    assert (d["prompts"], d["concurrency"], d["max_tokens"]) == (8, 2, 64)
    assert d["chat_template"] == str(tok / "tokenizer_config.json") and d["sampling"]["forced_length"] is False
    h = sparkserve("history", "--json", "--kind", "bench", env=env)
    assert h.returncode == 0, h.stderr
    assert json.loads(h.stdout)["entries"][0]["summary"].startswith("smoke [card]: ")
    bad = sparkserve("bench", "--cell", "smoke", "--protocol", "forced", "--chat-template", str(tok), "--url",
                     emu.url, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --chat-template:")
    size = sparkserve("bench", "--cell", "smoke", "--size", "8x2", "--url", emu.url, env=env)
    assert size.returncode == 2 and size.stderr.startswith("error: --size:")


# -- which template: --chat-template, else model.target (a directory, or a repo id in this machine's cache) ----


def _cfg(target: str) -> Any:
    from sparkserve.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "sparkserve" / "data" / "default.yaml")
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"target": Path(target)})})


def test_the_template_comes_from_the_option_else_the_local_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    from sparkserve.measure.run import target_template

    tok = _tok_dir(tmp_path, QWEN_TINY)
    assert target_template(_cfg("/nowhere/target"), tok).source == str(tok / "tokenizer_config.json")
    assert target_template(_cfg(str(tok)), None).render_user("q").endswith("<think>\n")
    with pytest.raises(BadInput) as e:
        target_template(_cfg("/nowhere/target"), None)
    assert e.value.where == "--chat-template" and "not on this machine" in e.value.what
    # a Hugging Face repo id, resolved in this machine's hub cache ($HF_HUB_CACHE)
    hub = tmp_path / "hub"
    sha = "a" * 40
    snap = hub / "models--org--tiny" / "snapshots" / sha
    snap.mkdir(parents=True)
    (hub / "models--org--tiny" / "refs").mkdir()
    (hub / "models--org--tiny" / "refs" / "main").write_text(sha)
    (snap / "config.json").write_text("{}")
    (snap / "chat_template.jinja").write_text("HF:{{ messages[0].content }}")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert target_template(_cfg("org/tiny"), None).render_user("x") == "HF:x"
    with pytest.raises(BadInput) as e:
        target_template(_cfg("org/absent"), None)
    assert e.value.where == "--chat-template" and "hf download org/absent" in e.value.what


def test_bench_prompts_in_the_config_is_the_default_file(emulator: StartEmu, tmp_path: Path,  # noqa: F811
                                                         env: dict[str, str]) -> None:  # noqa: F811
    """`bench.prompts` pointing at the card's holdout file: `bench` reads it without --prompts, the cell taking
    its first N rows as the card's client does (here a 10-row file and an 8-prompt cell)."""
    from _fixtures import config_file

    emu = emulator({"SSEMU_EOS_AFTER": "10-60"})
    tok = _tok_dir(tmp_path, QWEN_TINY)
    holdout = tmp_path / "prompts_holdout_500.jsonl"
    holdout.write_text("".join(json.dumps({"id": f"h{i}", "prompt": f"q {i}"}) + "\n" for i in range(10)))
    cfg = config_file(tmp_path / "sparkserve.yaml", {"bench": {"prompts": str(holdout)}})
    p = sparkserve("bench", "--cell", "smoke", "--size", "8x2x64", "--chat-template", str(tok), "--url", emu.url,
                   "--model", MODEL, "--json", "-c", str(cfg), env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["prompts_source"], d["prompts"], d["protocol"]) == (str(holdout), 8, "card")
