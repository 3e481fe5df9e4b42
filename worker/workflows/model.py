"""Workflow bookkeeping, the pure part: keys, result packing, and a workflow item read as a status.

One DynamoDB item per workflow in the idempotency table, under the key ``workflow:<id>`` (ledger keys of jobs
never start with it unless a producer chooses so). Each step or member runs under the idempotency key
``workflow:<id>:<index>`` and a group's callback under ``workflow:<id>:callback``, so a step sent twice runs once.

Item attributes: ``kind`` (chain, group), ``total``, ``created_at``/``updated_at`` (epoch ms), ``expiration``
(epoch s, the table's TTL). A chain adds ``steps`` (JSON of its jobs), ``done_count``, ``state`` (running,
succeeded, failed), ``failed_index``, ``error`` and ``result`` (the last step's, packed). A group adds ``types``
(JSON list of its members' job types), ``callback`` (JSON of the callback job), ``on_failure``, ``done`` and
``failed`` (String Sets of finished and failed member indexes), ``e_<i>`` (failed member i's error) and
``callback_state`` (absent, ``sending``, ``sent``). Members' results stay in their own ledger records (read once,
with BatchGetItem, when the callback is sent): the group item stays small, so each member's write costs about
one write unit however large the results are.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from worker.errors import ConfigError

ITEM_PREFIX = "workflow:"
#: A member's result larger than this (JSON bytes) travels as a reference to its ledger record.
MAX_INLINE_RESULT_BYTES = 4096
#: All inline results of one group together stay below this: the item (400 KB) and the callback message fit.
INLINE_BUDGET_BYTES = 200_000
#: A member's error as kept in the item and handed to the callback.
MAX_ERROR_CHARS = 500
#: Workflow items live as long as ledger records (the table's TTL attribute).
WORKFLOW_TTL_S = 7 * 24 * 3600
MAX_MEMBERS = 10_000

OnFailure = Literal["callback", "dead_letter"]
ON_FAILURE_CHOICES: tuple[OnFailure, ...] = ("callback", "dead_letter")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


def new_workflow_id() -> str:
    return "wf-" + uuid.uuid4().hex


def check_workflow_id(workflow_id: str) -> str:
    if not _ID.match(workflow_id):
        raise ConfigError("workflow_id: 1-100 characters of letters, digits and _ . : - only")
    return workflow_id


def item_key(workflow_id: str) -> str:
    return ITEM_PREFIX + workflow_id


def step_key(workflow_id: str, index: int) -> str:
    """The idempotency key of a chain step or group member."""
    return f"{ITEM_PREFIX}{workflow_id}:{index}"


def callback_key(workflow_id: str) -> str:
    return f"{ITEM_PREFIX}{workflow_id}:callback"


def lookup_key(workflow_id: str) -> str:
    """The item key of a workflow named by its id or by ``workflow:<id>`` (what ``status`` and the dashboard take)."""
    return workflow_id if workflow_id.startswith(ITEM_PREFIX) else item_key(workflow_id)


def final_key(item: dict[str, Any]) -> str | None:
    """The idempotency key of the job that ends the workflow of ``item`` (a chain's last step, a group's
    callback); None when ``item`` is no workflow's."""
    if item.get("kind") not in ("chain", "group"):
        return None
    workflow_id = str(item["key"])[len(ITEM_PREFIX) :]
    if item["kind"] == "group":
        return callback_key(workflow_id)
    return step_key(workflow_id, int(item.get("total", 0)) - 1)


def inline_limit_bytes(total: int) -> int:
    """The largest result of one of ``total`` members kept inline (the rest travel as references)."""
    return min(MAX_INLINE_RESULT_BYTES, INLINE_BUDGET_BYTES // max(1, total))


def pack_result(result: Any, *, key: str, limit_bytes: int) -> Any:
    """``result`` when its JSON fits ``limit_bytes``, else ``{"result_ref": key}``: the step's ledger record
    (``sqs-worker status KEY``; the ledger keeps results up to 32 KiB, larger ones belong in S3 or alike)."""
    try:
        size = len(json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        return {"result_ref": key}
    return result if size <= limit_bytes else {"result_ref": key}


def callback_input(workflow_id: str, item: dict[str, Any], results: list[Any] | None = None) -> dict[str, Any]:
    """What a group's callback gets as ``ctx.previous_result``: ``results`` in member order (None for a failed
    member) and the failures, each with its index, job type and error."""
    total = int(item.get("total", 0))
    types = _json_list(item.get("types"))
    failed = sorted(int(i) for i in item.get("failed") or ())
    results = [None if i in failed else r for i, r in enumerate(results or [None] * total)]
    return {
        "group_id": workflow_id,
        "results": results,
        "failed": [
            {"index": i, "type": types[i] if i < len(types) else None, "error": item.get(f"e_{i}")} for i in failed
        ],
    }


def failure_summary(workflow_id: str, item: dict[str, Any]) -> str:
    failed = sorted(int(i) for i in item.get("failed") or ())
    first = ", ".join(f"{i}: {item.get(f'e_{i}')}" for i in failed[:3])
    return f"group {workflow_id}: {len(failed)} of {item.get('total')} members failed ({first})"


def dump_result(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _loads(text: Any) -> Any:
    return json.loads(text) if isinstance(text, str) else None


def _json_list(text: Any) -> list[Any]:
    value = _loads(text)
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class WorkflowStatus:
    """A workflow item read for ``sqs-worker status``: n of m done, failures, and where it stands."""

    workflow_id: str
    kind: str
    total: int
    done: int
    failed: list[dict[str, Any]] = field(default_factory=list)
    state: str = "running"
    callback_state: str | None = None
    result: Any = None

    @property
    def percent(self) -> float:
        return round(100.0 * self.done / self.total, 1) if self.total else 100.0

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "kind": self.kind,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "percent": self.percent,
            "failed": self.failed,
            "callback_state": self.callback_state,
            "result": self.result,
        }

    def format(self) -> str:
        rows = [
            ("workflow", f"{self.workflow_id} ({self.kind})"),
            ("state", self.state),
            ("progress", f"{self.done} of {self.total} done ({self.percent:g}%)"),
            ("failed", ", ".join(f"#{f['index']} {f.get('type') or ''}: {f.get('error')}" for f in self.failed) or "-"),
        ]
        if self.kind == "group":
            rows.append(("callback", self.callback_state or "not yet sent"))
        rows.append(("result", "-" if self.result is None else json.dumps(self.result, ensure_ascii=False)))
        width = max(len(label) for label, _ in rows) + 1
        return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows)


def read_status(item: dict[str, Any], *, final: dict[str, Any] | None) -> WorkflowStatus:
    """The status of a workflow item. ``final``: the ledger record (``Record.to_json``) of the job that ends the
    workflow (a chain's last step, a group's callback), if any: its state and result finish the picture."""
    workflow_id = str(item["key"])[len(ITEM_PREFIX) :]
    kind = str(item.get("kind"))
    total = int(item.get("total", 0))
    if kind == "chain":
        done = int(item.get("done_count", 0))
        failed = []
        if item.get("failed_index") is not None:
            index = int(item["failed_index"])
            types = [step.get("type") for step in _json_list(item.get("steps"))]
            failed = [
                {"index": index, "type": types[index] if index < len(types) else None, "error": item.get("error")}
            ]
        state = str(item.get("state") or "running")
        return WorkflowStatus(workflow_id, kind, total, done, failed, state, result=_loads(item.get("result")))
    inputs = callback_input(workflow_id, item)
    done = len(item.get("done") or ())
    callback_state = item.get("callback_state")
    state = "running"
    result = None
    if done >= total:
        state = "waiting for callback"
        if final is not None and final.get("state") == "COMPLETED":  # also a dead-lettered callback requeued
            state = "succeeded"
            result = final.get("result")
        elif item.get("on_failure") == "dead_letter" and inputs["failed"] and callback_state == "sent":
            state = "dead_lettered"
        elif final is not None and final.get("state") == "FAILED":
            state = "failed"
            result = final.get("result")
        elif final is not None:
            state = "callback " + str(final.get("state")).lower()
    return WorkflowStatus(
        workflow_id,
        kind,
        total,
        done,
        inputs["failed"],
        state,
        callback_state=str(callback_state) if callback_state else None,
        result=result,
    )
