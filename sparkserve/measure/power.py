"""Energy per output token from the nodes' GPU power during a cell's measured window. Pure.

Example::

    watts = parse_power_draw("23.41\n")                     # Σ over the node's GPUs; None: no reading
    power = energy({"spark-a": [23.4, 24.0], "spark-b": []}, {"spark-b": "no nvidia-smi"}, 41.2, 9_000)
    power.joules_per_token                                  # None unless every node reported power

The samples are ``nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits`` (one line per GPU, watts,
``[N/A]`` or ``[Not Supported]`` where the board reports none), taken on each node over the existing node
access while the cell's requests run (:mod:`sparkserve.deploy.power`). Energy is Σ over nodes of the mean watts
× the window; joules per token only when every node of the stack reported power: a figure over part of the
stack would be too low, and none is invented where a node has no reading (the rig's nodes have no GPU).
"""

from __future__ import annotations

from sparkserve.measure.records import NodePower, Power

POWER_QUERY = ["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"]


def parse_power_draw(stdout: str) -> float | None:
    """The node's GPU power in watts (summed over its GPUs); None when no GPU gave a number."""
    total, seen = 0.0, False
    for line in stdout.splitlines():
        try:
            total += float(line.strip())
            seen = True
        except ValueError:
            continue  # "[N/A]", "[Not Supported]", blank
    return total if seen else None


def energy(samples: dict[str, list[float]], notes: dict[str, str], window_s: float, output_tokens: int) -> Power:
    """Each node's mean watts over the window and, when every node has samples, joules per output token."""
    nodes = []
    for name in sorted(set(samples) | set(notes)):
        got = samples.get(name) or []
        mean = round(sum(got) / len(got), 3) if got else None
        nodes.append(NodePower(node=name, samples=len(got), mean_w=mean,
                               note=None if got else notes.get(name, "no power reading during the window")))
    missing = [n.node for n in nodes if n.mean_w is None]
    if not nodes:
        return Power(nodes=[], window_s=round(window_s, 6), note="no node was sampled: no power reading")
    if missing:
        return Power(nodes=nodes, window_s=round(window_s, 6),
                     note=f"no power reading on {', '.join(missing)}: no energy figure (none is invented)")
    joules = sum(n.mean_w or 0.0 for n in nodes) * window_s
    return Power(nodes=nodes, window_s=round(window_s, 6), joules=round(joules, 3),
                 joules_per_token=round(joules / output_tokens, 6) if output_tokens > 0 else None,
                 tokens_per_joule=round(output_tokens / joules, 6) if joules > 0 else None)
