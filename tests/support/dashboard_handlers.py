"""Handlers for the dashboard's browser tests: some fail with distinct errors, one keyed job reports progress, two
make a group (workflow) the Jobs page shows."""

from __future__ import annotations

from typing import Any

from worker import JobContext, PermanentError, job


@job("charge_card", max_attempts=2)
async def charge_card(payload: dict[str, Any], ctx: JobContext) -> None:
    raise PermanentError("card declined by issuer")


@job("resize_image", max_attempts=2)
async def resize_image(payload: dict[str, Any], ctx: JobContext) -> None:
    raise PermanentError("image too large: 9000x9000")


@job("build_report", key=lambda payload: payload["report"])
async def build_report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    ctx.progress(100, "all pages rendered")
    return {"pages": 12, "api_token": payload.get("api_token")}


@job("sync_invoice", key=lambda payload: payload["invoice"])
async def sync_invoice(payload: dict[str, Any], ctx: JobContext) -> None:
    raise PermanentError("invoice rejected by the ledger API")


@job("square")
async def square(payload: dict[str, Any], ctx: JobContext) -> int:
    return int(payload["n"]) ** 2


@job("total")
async def total(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    members = ctx.previous_result
    return {"sum": sum(r for r in members["results"] if r is not None), "failed": len(members["failed"])}
