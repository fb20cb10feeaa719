"""What `up` checks before it says serving, and what `bench` reads: ``gates`` (the pool, the mask token, the
smoke cell, the settle window) and ``bench``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sparkserve.config.fields import Strict


class SmokeCell(Strict):
    prompts: int = Field(default=20, ge=1, description="requests in the smoke cell")
    concurrency: int = Field(default=1, ge=1, description="smoke requests in flight at once")
    max_tokens: int = Field(default=512, ge=1, description="max_tokens of each smoke request")
    request_timeout_s: float = Field(default=120.0, gt=0, description="the deadline of each smoke request; one past "
                                     "it fails the smoke gate")
    # how the cell is measured, not what runs: excluded from the dump, so not part of the deployment fingerprint
    warmup: int | None = Field(default=None, ge=0, exclude=True, description="unmeasured requests before the smoke "
                               "cell, at its concurrency and length (null: concurrency × 2; 0: none); a failed one "
                               "fails the smoke gate too")


class GatesConfig(Strict):
    pool_tokens: int | None = Field(default=366749, ge=1, description="the KV pool every rank must report (`KV cache "
                                    "size: N tokens`: the card's 8-GiB discriminator); null: the pool banked for this "
                                    "deployment (`gates --bank`), else any")
    mask_token_id: int | None = Field(default=154856, description="the id the mask gate expects in the mask-loader "
                                      "line, checked against the drafter's config by validate; null: the gate is "
                                      "required only for a drafter with mask_embedding.pt")
    smoke: SmokeCell = Field(default_factory=SmokeCell)
    # how long `up` watches, not what runs: excluded from the dump, so not part of the deployment fingerprint
    settle_s: float = Field(default=3.0, ge=0, exclude=True, description="after the gates pass, `up` keeps "
                            "watching every rank this long before it says serving (a rank dying then fails `up`); "
                            "`up --no-gates` runs no gates and so no settle window")


class BenchConfig(Strict):
    prompts: Path | None = Field(default=None, description="the JSONL `bench` and `ab run` read when --prompts "
                                 "is not given (the card's drafter/eval/prompts_holdout_500.jsonl: each cell "
                                 "takes its first N rows)")

