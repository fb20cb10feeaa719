"""The nodes' GPU power sampled over a bench cell's measured window, over the existing node access.

Example::

    sampler = PowerSampler(nodes)             # measure.run.Window: started after the warm-up and first /metrics
    sampler.start(); …; power = sampler.stop(window_s, output_tokens)

One thread per node runs ``nvidia-smi --query-gpu=power.draw`` every ``interval_s`` (the first at once) until
stopped; a node without ``nvidia-smi`` or without a power reading (the rig) is named, never given a figure.
The figures are :func:`sparkserve.measure.power.energy`'s.
"""

from __future__ import annotations

import threading

from sparkserve.errors import SparkserveError
from sparkserve.measure.power import POWER_QUERY, energy, parse_power_draw
from sparkserve.measure.records import Power
from sparkserve.nodes.base import Node

NOT_FOUND = 127  # the shell's (and coreutils timeout's) exit status for a command it cannot find


class PowerSampler:
    """Samples every node's GPU power from :meth:`start` to :meth:`stop`."""

    def __init__(self, nodes: dict[str, Node], *, interval_s: float = 1.0) -> None:
        self.nodes = nodes
        self.interval_s = interval_s
        self.samples: dict[str, list[float]] = {n: [] for n in nodes}
        self.notes: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _one(self, name: str, node: Node) -> None:
        while True:
            try:
                res = node.run(POWER_QUERY, timeout=10, step="power", check=False)
            except SparkserveError as e:
                self.notes[name] = f"power not read: {e.line()}"
                return
            if res.exit_code == NOT_FOUND:
                self.notes[name] = "no nvidia-smi on this node: no power reading"
                return
            watts = parse_power_draw(res.stdout) if res.ok else None
            if watts is None:
                self.notes[name] = ("nvidia-smi reports no power reading" if res.ok else
                                    f"nvidia-smi failed (exit {res.exit_code}): {res.stderr.strip()[:120]}")
            else:
                self.samples[name].append(watts)
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> None:
        for name, node in self.nodes.items():
            t = threading.Thread(target=self._one, args=(name, node), name=f"power-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, window_s: float, output_tokens: int) -> Power:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)
        return energy(self.samples, self.notes, window_s, output_tokens)
