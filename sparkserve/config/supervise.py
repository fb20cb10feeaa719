"""``supervise``: the checks `sparkserve supervise` runs on a serving stack and the bounds of its recovery."""

from __future__ import annotations

from pydantic import Field

from sparkserve.config.fields import ByteSize, Strict


class SuperviseConfig(Strict):
    """`sparkserve supervise`: the checks that keep a serving stack honest, and the bounds of its recovery."""

    interval_s: float = Field(default=5.0, gt=0, description="one round of checks every N seconds")
    canary_deadline_s: float = Field(default=10.0, gt=0, description="a canary generation slower than this "
                                     "is a failed progress check")
    canary_max_tokens: int = Field(default=4, ge=1, le=64, description="max_tokens of each canary generation")
    stall_s: float = Field(default=15.0, gt=0, description="requests running while the generation counters "
                           "stay frozen this long = wedged")
    confirm_rounds: int = Field(default=1, ge=1, description="rounds a fault must hold before recovery acts")
    acceptance_window_s: float = Field(default=30.0, gt=0, description="acceptance is judged per window of "
                                       "this length (from /metrics deltas)")
    acceptance_min_drafts: int = Field(default=50, ge=1, description="a window with fewer drafts is not judged")
    acceptance_drop: float = Field(default=0.5, gt=0, lt=1, description="alarm when the live acceptance "
                                   "length − 1 falls below this fraction of the banked band's")
    memfree_floor_bytes: ByteSize = Field(default=4 * 2**30, description="each node's MemFree floor while "
                                          "serving (GB10: the driver allocates from MemFree, not MemAvailable)")
    meminfo_path: str = Field(default="/proc/meminfo", description="where each node's memory facts are read "
                              "({node} = the node's name: a fake source for tests)")
    kmsg_path: str = Field(default="/dev/kmsg", description="each node's kernel log (NVRM / Xid lines); a "
                           "plain file is read as text ({node} as above)")
    log_follow: bool = Field(default=True, description="read every rank's new log lines each round and judge them for "
                             "fault lines (false: do not)")
    max_restarts: int = Field(default=3, ge=0, description="the give-up budget: restarts within budget_window_s")
    budget_window_s: float = Field(default=1800.0, gt=0, description="the window, in seconds, in which the give-up "
                                   "budget counts restarts")
    backoff_s: float = Field(default=10.0, ge=0, description="the first wait before a restart; doubled each "
                             "time, up to backoff_max_s")
    backoff_max_s: float = Field(default=300.0, ge=0, description="the longest wait between two restarts, in seconds")
    recover: bool = Field(default=True, description="false: detect, keep forensics and alert, never restart")
    incidents_dir: str | None = Field(default=None, description="where incident dirs go (default: the "
                                      "state dir's supervise/incidents)")
    listen: str = Field(default="127.0.0.1:9321", description="the exporter and status page (host:port; "
                        "empty: off)")
    alert_urls: list[str] = Field(default_factory=list, description="apprise notification URLs (Slack, "
                                  "Discord, ntfy, mailto, json:// webhooks)")
    pyspy: str = Field(default="py-spy", description="the py-spy executable on each node (or next to "
                       "serve.vllm's venv)")

