"""Handlers for the workflow process tests: each run appends a line to TEST_EFFECTS_FILE (pid included)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from worker import JobContext, job


def _effect(text: str) -> None:
    with open(os.environ["TEST_EFFECTS_FILE"], "a", encoding="utf-8") as effects:
        effects.write(f"{text} pid={os.getpid()}\n")


@job("wf_member", max_attempts=10)
def member(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    time.sleep(float(payload.get("seconds", 0)))
    _effect(f"member {payload['i']}")
    return {"i": payload["i"], "square": payload["i"] ** 2}


@job("wf_collect", max_attempts=10)
def collect(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    results = ctx.previous_result["results"]
    _effect("callback " + json.dumps([r["i"] for r in results]))
    return {"sum": sum(r["square"] for r in results)}
