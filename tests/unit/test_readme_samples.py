"""The sample output in README.md and the two-Sparks guide is what the CLI prints (issue 33).

`validate`'s lines are checked against a real `sparkserve validate` run on the `init` file with checkpoints that
carry the card's drafter facts (block 8, mask_token_id 154856, 9 taps at [5, 9, … 42]); `up`'s narration
against the `say(…)` calls of the deploy code (each one's f-string as a pattern) and the gate verdicts the
gates judge on the committed fixture logs. In a sample, `…` stands for what depends on the machines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from _fixtures import REPO, clean_env, cli
from tiny_models import DrafterSpec, TargetSpec, write_drafter, write_target

from sparkserve.config import load_config
from sparkserve.docgen import gen as docs_gen
from sparkserve.models.drafter_identity import EFG_CONFIG_SHA256, DrafterIdentity
from sparkserve.observe.gate_report import GATE_NAMES

PAGES = [REPO / "README.md", REPO / "docs" / "getting-started" / "two-sparks.md"]
CARD_TAPS = [5, 9, 14, 19, 24, 28, 33, 38, 42]  # drafter/cards/GLM-5.3-Flash-DFlash2-E.md, "Target taps"


def _sample(page: Path, command: str) -> list[str]:
    """The lines under ``$ sparkserve COMMAND`` in the page's first ```text block that has it."""
    text = page.read_text()
    block = next(b for b in re.findall(r"```text\n(.*?)```", text, re.S) if f"$ sparkserve {command}\n" in b)
    lines = block.split(f"$ sparkserve {command}\n", 1)[1].splitlines()
    out = []
    for ln in lines:
        if ln.startswith("$ ") or not ln.strip():
            break
        out.append(ln)
    return out


def _wild(sample_line: str) -> re.Pattern[str]:
    """A sample line as a pattern: `…` matches anything, a 16-hex config fingerprint any other."""
    parts = [re.escape(p) for p in sample_line.split("…")]
    pat = ".+?".join(parts)
    pat = re.sub(r"config\\ [0-9a-f]{16}", r"config\\ [0-9a-f]{16}", pat)
    return re.compile(pat)


@pytest.fixture(scope="module")
def validate_out(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    tmp = tmp_path_factory.mktemp("v")
    env = clean_env(tmp)
    cfg = load_config()
    drafter = write_drafter(tmp / Path(cfg.drafter.path).name,
                            DrafterSpec(target_layer_ids=CARD_TAPS, num_hidden_layers=8))
    target = write_target(tmp / Path(str(cfg.model.target)).name, TargetSpec(num_hidden_layers=46))
    assert cli("init", str(tmp / "sparkserve.yaml"), env=env).returncode == 0
    p = cli("validate", "--offline", "-c", str(tmp / "sparkserve.yaml"), "--drafter", str(drafter),
            "--target", str(target), env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_validate_sample_is_what_validate_prints(page: Path, validate_out: list[str]) -> None:
    sample = _sample(page, "validate")
    assert len(sample) == len(validate_out) == 5, (sample, validate_out)
    cfg = load_config()
    # which of the card's drafters: the sample shows the card's -G as validate names it (its config.json digest and
    # its directory); the fixture drafter is too small to be one, so its line only has the same form
    ident = DrafterIdentity("E/F/G", "G", f"config.json sha256 {EFG_CONFIG_SHA256[0]}…{EFG_CONFIG_SHA256[1]}, the one "
                            "E, F and G share; the directory names -G")
    assert sample[2] == f"drafter is {ident.name} ({ident.evidence})" and validate_out[2].startswith("drafter is ")
    assert Path(str(cfg.drafter.path)).name.endswith("-G")
    sample, validate_out = sample[:2] + sample[3:], validate_out[:2] + validate_out[3:]
    for want, got in zip(sample, validate_out, strict=True):
        # where a model was read: the sample reads it on the head, the test on this machine
        where = re.search(r" \[(?:inside \[)?([^\[\]]*)\]$", want)
        if where:
            assert re.fullmatch(rf"on {cfg.head.name} \(head\): /\S+", where.group(1)), want
            assert where.group(1).split(": ")[1] in (str(cfg.drafter.path), str(cfg.model.target)), want
            want, got = want[:where.start(1)], got[:got.rindex("[") + 1]
        assert _wild(want).fullmatch(got), f"\n{page.name}: {want}\nvalidate:  {got}"
    assert "the model card's vLLM fork" in sample[-1]


def _say_patterns() -> list[re.Pattern[str]]:
    """Every narration line the deploy code can say (its f-strings, formatted values as wildcards), and what
    `up` prints at the end."""

    def rx(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return re.escape(node.value)
        if isinstance(node, ast.JoinedStr):
            return "".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".*?" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = rx(node.left), rx(node.right)
            return None if a is None or b is None else a + b
        if isinstance(node, ast.IfExp):
            a, b = rx(node.body), rx(node.orelse)
            return None if a is None or b is None else f"(?:{a}|{b})"
        return None

    out = []
    for path in [*(REPO / "sparkserve" / "deploy").glob("*.py"), REPO / "sparkserve" / "commands" / "deploy.py"]:
        tree = ast.parse(path.read_text())
        said = [n.args[0] for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
                and getattr(n.func, "id", getattr(n.func, "attr", "")) in ("say", "print")]
        said += [r.value for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name.endswith("_line")
                 for r in ast.walk(f) if isinstance(r, ast.Return) and r.value is not None]  # say(_smoke_line(…))
        out += [re.compile(pat) for pat in map(rx, said) if pat]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_up_sample_is_what_up_says(page: Path) -> None:
    sample = _sample(page, "up")
    judged = {g["name"]: g["reason"] for g in docs_gen._gates_doc()["gates"]}
    patterns = _say_patterns()
    gates: list[str] = []
    for line in sample:
        m = re.fullmatch(r"· gate (\w+): ok — (.*)", line)
        if m:
            gates.append(m.group(1))
            if m.group(2) != "…":  # a verdict the sample spells out is the judge's on the fixture logs
                assert m.group(2) == judged[m.group(1)], (line, judged[m.group(1)])
        elif line.startswith("· "):
            assert any(p.fullmatch(line[2:]) for p in patterns), f"{page.name}: nothing in deploy/ says {line!r}"
        elif line.startswith("started: "):
            assert any(p.fullmatch(line) for p in patterns), line
    assert gates == list(GATE_NAMES), "one line per gate, in the gates' order"
