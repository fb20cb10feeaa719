"""Energy per token from the nodes' GPU power over the measured window (measure/power.py, deploy/power.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sparkserve.deploy.power import PowerSampler
from sparkserve.measure.power import energy, parse_power_draw
from sparkserve.nodes.local import LocalNode


def test_power_draw_sums_the_gpus_and_a_board_without_a_reading_gives_none() -> None:
    assert parse_power_draw("23.41\n30.00\n") == pytest.approx(53.41)
    assert parse_power_draw("[N/A]\n") is None and parse_power_draw("[Not Supported]\n\n") is None
    assert parse_power_draw("12.5\n[N/A]\n") == 12.5


def test_joules_per_token_only_when_every_node_reported() -> None:
    full = energy({"a": [40.0, 44.0], "b": [30.0]}, {}, 10.0, 2000)
    assert full.joules == pytest.approx((42.0 + 30.0) * 10) and full.joules_per_token == pytest.approx(0.36)
    assert full.tokens_per_joule == pytest.approx(2000 / 720)
    part = energy({"a": [40.0], "b": []}, {"b": "no nvidia-smi on this node: no power reading"}, 10.0, 2000)
    assert part.joules is None and part.joules_per_token is None and part.note is not None and "b" in part.note
    assert [n.mean_w for n in part.nodes] == [40.0, None] and "no nvidia-smi" in (part.nodes[1].note or "")


def test_a_node_without_nvidia_smi_is_named_and_given_no_figure(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here (the rig's nodes have none either)
    s = PowerSampler({"spark-a": LocalNode("spark-a")}, interval_s=0.05)
    s.start()
    p = s.stop(2.0, 100)
    assert p.joules_per_token is None and p.nodes[0].samples == 0
    assert p.nodes[0].note == "no nvidia-smi on this node: no power reading"


def test_a_node_reporting_power_is_sampled_over_the_window(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a stand-in for nvidia-smi's CSV answer (one GPU at 25 W, a second without a reading, as a GB10 board may say)
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nprintf '25.00\\n[N/A]\\n'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    s = PowerSampler({"spark-a": LocalNode("spark-a")}, interval_s=0.01)
    s.start()
    for _ in range(1000):  # wait on the condition (three samples taken), bounded
        if s.samples["spark-a"][2:]:
            break
        s._stop.wait(0.01)
    p = s.stop(4.0, 50)
    assert p.nodes[0].mean_w == 25.0 and p.nodes[0].samples >= 3
    assert p.joules == pytest.approx(100.0) and p.joules_per_token == pytest.approx(2.0)
