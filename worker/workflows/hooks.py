"""What the worker does when a workflow step finishes: advance a chain, count a group member, send the callback.

The worker calls ``succeeded`` after a step's completion is recorded in the ledger and before the message is
deleted, and again for every later copy of that message (the ledger answers "completed" with the stored result).
It calls ``failed`` before a step is dead-lettered. Every call is safe to repeat:

- chain: one conditional write moves ``done_count`` from i to i+1; the next step is sent with its fixed
  idempotency key, whether that write went through or was a duplicate's, so a crash between the write and the
  send is repaired by the copy that reappears, and a second send runs once (the ledger).
- group: one conditional write adds the member to the ``done`` String Set unless it is there already (a
  duplicate finish changes nothing). Whoever sees the set complete flips ``callback_state`` from absent to
  ``sending`` with its SQS MessageId in ``callback_by`` (conditional: exactly one winner), sends the callback
  with the fixed key ``workflow:<id>:callback`` and marks it ``sent``; only then is its member's message deleted.
  A worker killed between the flip and the send leaves that message to reappear (same MessageId): the copy
  finds ``sending`` by itself and sends; the ledger runs the callback once even if the first send did go out.
  Other copies leave a ``sending`` flag alone unless it is older than STALE_SENDING_S (its message went to the
  DLQ after too many receives), so a second send happens only after a crash. After ``sent``, never again.
  The callback's input is read from the members' ledger records (BatchGetItem), not kept in the group item.

A failure of the table or the queue raises (LedgerUnavailable, QueueUnavailable): the worker puts the message
back and the next copy repeats the call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from worker.deadletter import dead_letter_record
from worker.envelope import Envelope, WorkflowRef, dump_envelope
from worker.workflows.model import (
    MAX_ERROR_CHARS,
    MAX_INLINE_RESULT_BYTES,
    callback_input,
    callback_key,
    dump_result,
    failure_summary,
    inline_limit_bytes,
    pack_result,
    step_key,
)
from worker.workflows.store import Item, WorkflowStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from worker.backends.protocols import MessageQueue
    from worker.idempotency import Record

log = logging.getLogger("worker.workflows")

#: A ``sending`` flag older than this is taken over by any member's copy (its flipper's message is gone).
STALE_SENDING_S = 120
#: A chain step's success counts when the chain is at this step, running, or failed at this very step (the step
#: was requeued from the DLQ and went through: the chain resumes).
CHAIN_STEP_DONE = (
    "attribute_exists(#key) AND #done_count = :index AND "
    "(#state = :running OR (#state = :failed AND #failed_index = :index))"
)
FIRST_FINISH = "attribute_exists(#key) AND NOT contains(#done, :member)"


def recorded_result(record: Record | None, key: str) -> Any:
    """A completed step's result as the ledger kept it; a reference when it was too large to keep."""
    if record is None:
        return None
    if record.result is None and record.result_note:
        return {"result_ref": key}
    return record.result


def deduplication_id(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class WorkflowHooks:
    """Advances workflows from the worker's outcomes; sends go to the worker's queue (and DLQ)."""

    def __init__(
        self, store: WorkflowStore, *, queue: MessageQueue, dlq: MessageQueue, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.queue = queue
        self.dlq = dlq
        self._clock = clock

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def succeeded(self, envelope: Envelope, result: Any, *, message_id: str) -> None:
        ref = envelope.workflow
        if ref is None:
            return
        key = envelope.idempotency_key or step_key(ref.id, ref.index)
        if ref.kind == "chain":
            await self._chain_step_done(ref, pack_result(result, key=key, limit_bytes=MAX_INLINE_RESULT_BYTES))
        elif ref.kind == "group":
            await self._member_finished(ref, error=None, message_id=message_id)  # its result: in its ledger record

    async def failed(self, envelope: Envelope, error: str, *, message_id: str) -> None:
        ref = envelope.workflow
        if ref is None:
            return
        error = error[:MAX_ERROR_CHARS]
        if ref.kind == "chain":
            await self.store.update(
                ref.id,
                assign={"state": "failed", "failed_index": ref.index, "error": error},
                condition="attribute_exists(#key)",
                now_ms=self._now_ms(),
            )
        elif ref.kind == "group":
            await self._member_finished(ref, error=error, message_id=message_id)

    # ----------------------------------------------------------------------------------------------- chains

    async def _chain_step_done(self, ref: WorkflowRef, packed: Any) -> None:
        following = ref.index + 1
        state = "succeeded" if following >= ref.total else "running"
        ok, item = await self.store.update(
            ref.id,
            assign={"done_count": following, "result": dump_result(packed), "state": state},
            remove=("failed_index", "error"),
            condition=CHAIN_STEP_DONE,
            values={"index": ref.index, "running": "running", "failed": "failed"},
            now_ms=self._now_ms(),
        )
        if item is None:
            log.warning("chain %s has no item (expired or never started): its next step is not sent", ref.id)
            return
        steps = json.loads(str(item.get("steps") or "[]"))
        if following >= len(steps) or item.get("state") == "failed":
            return  # the last step, or a late copy of a step before the one that failed: nothing more runs
        if not ok and int(item.get("done_count", 0)) < following:
            return  # a copy of a step the chain has not reached: cannot happen unless the item was replaced
        step = steps[following]
        key = step_key(ref.id, following)
        body = dump_envelope(
            step["type"],
            step.get("payload") or {},
            key,
            WorkflowRef(id=ref.id, kind="chain", index=following, total=ref.total, input=packed),
        )
        await self.queue.send(body, group_id=ref.id, deduplication_id=deduplication_id(key))

    # ----------------------------------------------------------------------------------------------- groups

    async def _results(self, workflow_id: str, total: int) -> list[Any]:
        """The members' results from their ledger records (one BatchGetItem per 100), packed for the callback."""
        from worker.idempotency import parse_record

        keys = [step_key(workflow_id, index) for index in range(total)]
        items = await self.store.batch_get(keys)
        limit = inline_limit_bytes(total)
        results = []
        for key in keys:
            item = items.get(key)
            record = parse_record(item) if item is not None and "status" in item else None
            results.append(pack_result(recorded_result(record, key), key=key, limit_bytes=limit))
        return results

    def _sends(self, item: Item, message_id: str) -> bool:
        """Whether this member's message sends the callback: it flipped ``sending`` (first time or as the copy
        that reappears after its worker died), or the flip is older than STALE_SENDING_S (its message is gone,
        e.g. to the DLQ). Other copies leave it to the flipper: no second send in the common case."""
        if item.get("callback_state") != "sending":
            return False
        if item.get("callback_by") == message_id:
            return True
        return self._now_ms() - int(item.get("callback_at", 0)) > STALE_SENDING_S * 1000

    async def _member_finished(self, ref: WorkflowRef, *, error: str | None, message_id: str) -> None:
        member = str(ref.index)
        add = {"done": {member}}
        assign: dict[str, Any] = {}
        if error is not None:
            assign = {f"e_{member}": error}
            add["failed"] = {member}
        _, item = await self.store.update(
            ref.id, assign=assign, add=add, condition=FIRST_FINISH, values={"member": member}, now_ms=self._now_ms()
        )
        if item is None:
            log.warning("group %s has no item (expired or never started): member %s not counted", ref.id, member)
            return
        if len(item.get("done") or ()) >= int(item.get("total", 0)):
            await self._send_callback(ref.id, item, message_id)

    async def _send_callback(self, workflow_id: str, item: Item, message_id: str) -> None:
        if item.get("callback_state") is None:
            _, after = await self.store.update(
                workflow_id,
                assign={"callback_state": "sending", "callback_by": message_id, "callback_at": self._now_ms()},
                condition="attribute_not_exists(#callback_state)",
                now_ms=self._now_ms(),
            )
            if after is None:
                return
            item = after
        if not self._sends(item, message_id):
            return
        callback = json.loads(str(item["callback"]))
        inputs = callback_input(workflow_id, item, await self._results(workflow_id, int(item.get("total", 0))))
        key = callback_key(workflow_id)
        body = dump_envelope(
            callback["type"],
            callback.get("payload") or {},
            key,
            WorkflowRef(id=workflow_id, kind="callback", index=0, total=1, input=inputs),
        )
        if inputs["failed"] and item.get("on_failure") == "dead_letter":
            record = dead_letter_record(
                category="permanent",
                error_message=failure_summary(workflow_id, item),
                attempts=0,
                source_queue=self.queue.name,
                original_message_id=key,
                failed_at=datetime.now(UTC),
                body=body,
                workflow_id=workflow_id,
            )
            await self.dlq.send(
                body, attributes=record.attributes, group_id=workflow_id, deduplication_id=deduplication_id(key)
            )
            log.warning("group %s dead-lettered: %s", workflow_id, failure_summary(workflow_id, item))
        else:
            await self.queue.send(body, group_id=workflow_id, deduplication_id=deduplication_id(key))
        await self.store.update(
            workflow_id, assign={"callback_state": "sent"}, condition="attribute_exists(#key)", now_ms=self._now_ms()
        )
