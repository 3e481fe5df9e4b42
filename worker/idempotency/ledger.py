"""The job ledger: one item per idempotency key guarding a job's single effect.

The logic lives here (state transitions as pure functions, record parsing, expiry, result capping, progress
rate limiting); ``worker.idempotency.dynamodb`` only reads and writes items.

A claim is one conditional UpdateItem. It succeeds when there is no item, or the item (same payload, not
expired) is FAILED, released after a retryable failure, or IN_PROGRESS under a lapsed lease (a takeover).
Each successful claim increments ``attempts`` and the fencing ``token``; every later write of that attempt
(renew, progress, complete, release, fail) is conditioned on ``owner`` and ``token``, so a worker whose lease
was taken over cannot write over the new owner. An expired item (``expiration`` passed but not yet removed by
DynamoDB's TTL sweep) is replaced by a fresh one with a second, conditional write.

Stored statuses: IN_PROGRESS, COMPLETED, FAILED. Derived states (``Record.state``): RUNNING (live lease),
RETRY_PENDING (released after a retryable failure), LEASE_LAPSED (owner gone, e.g. crashed), COMPLETED,
FAILED, EXPIRED.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from worker.budgets import LEDGER, Budget
from worker.errors import LedgerUnavailable
from worker.idempotency.dynamodb import DynamoDBStore
from worker.idempotency.expressions import Update, all_of, any_of, cond

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

    from worker.backends.protocols import LedgerStore

logger = logging.getLogger("worker.idempotency")

DEFAULT_TTL_S = 7 * 24 * 3600
DEFAULT_RESULT_MAX_BYTES = 32 * 1024
MAX_ERROR_CHARS = 2000
MAX_NOTE_CHARS = 500
#: A claim that keeps racing (expired item replaced by someone else, item deleted meanwhile) gives up after
#: this many writes and reports "busy" for a short while.
MAX_CLAIM_WRITES = 3
CONTENDED_RETRY_S = 1.0

CONFLICT_REASON = "idempotency key reused with a different payload"

#: Claim: no item, or (same payload, not expired) FAILED, or IN_PROGRESS with its lease lapsed or released.
CLAIM_CONDITION = any_of(
    cond("absent"),
    all_of("unexpired", "same_payload", any_of(all_of("in_progress", "lease_lapsed"), cond("failed"))),
)
#: Every write of a running attempt: still IN_PROGRESS, and still ours (owner and fencing token).
OWNED_CONDITION = all_of("in_progress", "owner_is_me", "token_is_mine")
#: Replacing an expired item: only if nobody wrote it since we read it.
REPLACE_CONDITION = all_of("token_unchanged", "updated_at_unchanged")


class Status(StrEnum):
    """The status stored in an item."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class State(StrEnum):
    """What an item means at a given time (derived from status, lease and expiration)."""

    RUNNING = "RUNNING"
    RETRY_PENDING = "RETRY_PENDING"
    LEASE_LAPSED = "LEASE_LAPSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"


ClaimOutcome = Literal["run", "completed", "busy", "conflict"]
Decision = Literal["run", "completed", "busy", "conflict", "replace"]


@dataclass(frozen=True)
class Record:
    """One ledger item, parsed. Times: ``*_ms`` epoch milliseconds, ``expiration`` epoch seconds."""

    key: str
    status: Status
    expiration: int
    lease_expires_at_ms: int = 0
    owner: str | None = None
    token: int = 0
    payload_hash: str | None = None
    job_type: str | None = None
    attempts: int = 0
    last_error: str | None = None
    result: Any = None
    result_note: str | None = None
    progress: float | None = None
    progress_note: str | None = None
    created_at: int = 0
    updated_at: int = 0

    def is_expired(self, now_ms: int) -> bool:
        return self.expiration <= now_ms // 1000

    def lease_remaining_s(self, now_ms: int) -> float:
        return max(0.0, (self.lease_expires_at_ms - now_ms) / 1000)

    def state(self, now_ms: int) -> State:
        if self.is_expired(now_ms):
            return State.EXPIRED
        if self.status is Status.COMPLETED:
            return State.COMPLETED
        if self.status is Status.FAILED:
            return State.FAILED
        if self.lease_expires_at_ms > now_ms:
            return State.RUNNING
        return State.RETRY_PENDING if self.owner is None else State.LEASE_LAPSED

    def to_json(self, now_ms: int) -> dict[str, Any]:
        """A JSON-ready view (as ``sqs-worker status --json`` prints it), with the derived state."""
        return {
            "key": self.key,
            "state": self.state(now_ms).value,
            "status": self.status.value,
            "job_type": self.job_type,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "progress": self.progress,
            "progress_note": self.progress_note,
            "result": self.result,
            "result_note": self.result_note,
            "owner": self.owner,
            "token": self.token,
            "lease_expires_at_ms": self.lease_expires_at_ms,
            "payload_hash": self.payload_hash,
            "created_at_ms": self.created_at,
            "updated_at_ms": self.updated_at,
            "expiration": self.expiration,
        }


def parse_record(item: Mapping[str, object]) -> Record:
    """An item (plain values, as the store returns it) as a Record. Unknown attributes are ignored."""

    def text(name: str) -> str | None:
        value = item.get(name)
        return value if isinstance(value, str) else None

    def integer(name: str) -> int:
        value = item.get(name)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0

    key = text("key")
    if key is None:
        raise ValueError("ledger item without a string 'key'")
    status_text = text("status") or Status.IN_PROGRESS.value
    try:
        status = Status(status_text)
    except ValueError:
        raise ValueError(f"ledger item {key!r} has an unknown status {status_text!r}") from None
    result_text = text("result")
    progress = item.get("progress")
    return Record(
        key=key,
        status=status,
        expiration=integer("expiration"),
        lease_expires_at_ms=integer("lease_expires_at_ms"),
        owner=text("owner"),
        token=integer("token"),
        payload_hash=text("payload_hash"),
        job_type=text("job_type"),
        attempts=integer("attempts"),
        last_error=text("last_error"),
        result=json.loads(result_text) if result_text is not None else None,
        result_note=text("result_note"),
        progress=float(progress) if isinstance(progress, int | float) and not isinstance(progress, bool) else None,
        progress_note=text("progress_note"),
        created_at=integer("created_at"),
        updated_at=integer("updated_at"),
    )


def decide_claim(record: Record | None, *, payload_hash: str, now_ms: int) -> Decision:
    """What a claim of ``record``'s key means now. The DynamoDB CLAIM_CONDITION is this function's "run"."""
    if record is None:
        return "run"
    if record.is_expired(now_ms):
        return "replace"
    if record.payload_hash != payload_hash:
        return "conflict"
    if record.status is Status.COMPLETED:
        return "completed"
    if record.status is Status.IN_PROGRESS and record.lease_expires_at_ms > now_ms:
        return "busy"
    return "run"


def encode_result(result: Any, *, max_bytes: int) -> tuple[str | None, str | None]:
    """The result as stored: (JSON text, None) when it is JSON and fits ``max_bytes``, else (None, a note)."""
    if result is None:
        return None, None
    try:
        text = json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))  # a lone surrogate in the result raises here
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"result not stored: not JSON-serialisable ({type(result).__name__}: {exc})"[:MAX_NOTE_CHARS]
    if size > max_bytes:
        return None, f"result not stored: {size} bytes of JSON exceed the {max_bytes}-byte limit"
    return text, None


def progress_delay_s(*, now_s: float, last_write_s: float | None, min_interval_s: float) -> float:
    """Seconds to wait before the next progress write may go out (0: now)."""
    if last_write_s is None:
        return 0.0
    return max(0.0, last_write_s + min_interval_s - now_s)


def truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


@dataclass(frozen=True)
class Claim:
    """The answer to a claim. ``token`` is set when ``outcome == "run"``."""

    outcome: ClaimOutcome
    key: str
    token: int | None = None
    retry_after_s: float | None = None
    reason: str | None = None
    record: Record | None = None

    @property
    def attempts(self) -> int:
        """Attempts run so far, this one included (0 when unknown)."""
        return self.record.attempts if self.record is not None else 0


@dataclass
class _ProgressState:
    """Progress bookkeeping of one running claim; touched only on its event loop."""

    loop: asyncio.AbstractEventLoop
    claim: Claim
    last_write_s: float | None = None
    pending: tuple[float, str | None] | None = None
    timer: asyncio.TimerHandle | None = None
    writing: asyncio.Task[None] | None = None
    closed: bool = False
    writes: int = field(default=0)


class Ledger:
    """Claims, renews and settles idempotency keys in a DynamoDB table (or another LedgerStore).

    ``owner`` identifies this worker process (e.g. ``f"{hostname}:{pid}:{uuid4().hex[:8]}"``). ``clock`` gives
    epoch seconds (injectable for tests). All methods raise LedgerUnavailable when the table cannot be reached.
    ``Ledger(client, table, owner=...)`` keeps its items in DynamoDB; ``Ledger(store=..., owner=...)`` in any
    :class:`~worker.backends.protocols.LedgerStore` (``worker.idempotency.memory.MemoryStore`` in tests).
    """

    def __init__(
        self,
        client: DynamoDBClient | None = None,
        table_name: str | None = None,
        *,
        owner: str,
        store: LedgerStore | None = None,
        clock: Callable[[], float] = time.time,
        result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES,
        ttl_s: int = DEFAULT_TTL_S,
        progress_min_interval_s: float = 5.0,
        budget: Budget = LEDGER,
    ) -> None:
        if not owner:
            raise ValueError("owner must not be empty")
        if ttl_s <= 0 or result_max_bytes < 0 or progress_min_interval_s < 0:
            raise ValueError("ttl_s must be > 0; result_max_bytes and progress_min_interval_s >= 0")
        if store is None:
            if client is None or not table_name:
                raise ValueError("give a DynamoDB client and table name, or a store")
            store = DynamoDBStore(client, table_name, budget=budget)
        self._store: LedgerStore = store
        self.table_name = store.table_name
        self.owner = owner
        self._clock = clock
        self._result_max_bytes = result_max_bytes
        self._ttl_s = ttl_s
        self._progress_min_interval_s = progress_min_interval_s
        self._progress: dict[tuple[str, int], _ProgressState] = {}

    # ----------------------------------------------------------------------------------------------- claims

    async def claim(self, *, key: str, job_type: str, payload_hash: str, lease_s: float) -> Claim:
        """Claim ``key`` for one attempt: one conditional write on the common path."""
        if lease_s <= 0:
            raise ValueError("lease_s must be > 0")
        for _ in range(MAX_CLAIM_WRITES):
            now_ms = self._now_ms()
            lease_ms = now_ms + math.ceil(lease_s * 1000)
            result = await self._store.update(
                key,
                Update(
                    assign={
                        "status": Status.IN_PROGRESS.value,
                        "owner": self.owner,
                        "lease_expires_at_ms": lease_ms,
                        "payload_hash": payload_hash,
                        "job_type": job_type,
                        "expiration": self._expiration(now_ms, lease_ms),
                        "updated_at": now_ms,
                    },
                    increment=("token", "attempts"),
                    keep_if_present={"created_at": now_ms},
                    remove=("progress", "progress_note", "result", "result_note"),
                ),
                condition=CLAIM_CONDITION,
                values=self._claim_values(now_ms, payload_hash),
                return_new=True,
            )
            if result.ok:
                return self._running(key, result.item)
            old = parse_record(result.item) if result.item is not None else None
            decision = decide_claim(old, payload_hash=payload_hash, now_ms=now_ms)
            if decision == "replace" and old is not None:
                replaced = await self._replace(old, job_type=job_type, payload_hash=payload_hash, lease_s=lease_s)
                if replaced is not None:
                    return replaced
            elif decision == "completed":
                return Claim("completed", key, record=old)
            elif decision == "busy" and old is not None:
                return Claim("busy", key, retry_after_s=old.lease_remaining_s(now_ms), record=old)
            elif decision == "conflict":
                return Claim("conflict", key, reason=CONFLICT_REASON, record=old)
            # "run" after a refused write: the item changed between check and write; look again.
        logger.warning("idempotency claim of %r kept racing; reporting busy", key)
        return Claim("busy", key, retry_after_s=CONTENDED_RETRY_S)

    async def _replace(self, old: Record, *, job_type: str, payload_hash: str, lease_s: float) -> Claim | None:
        """Overwrite an expired item with a fresh claim; None when someone wrote it since we read it."""
        now_ms = self._now_ms()
        lease_ms = now_ms + math.ceil(lease_s * 1000)
        item: dict[str, object] = {
            "key": old.key,
            "status": Status.IN_PROGRESS.value,
            "owner": self.owner,
            "token": old.token + 1,
            "attempts": 1,
            "lease_expires_at_ms": lease_ms,
            "payload_hash": payload_hash,
            "job_type": job_type,
            "expiration": self._expiration(now_ms, lease_ms),
            "created_at": now_ms,
            "updated_at": now_ms,
        }
        result = await self._store.put(
            item,
            condition=REPLACE_CONDITION,
            values={"seen_token": old.token, "seen_updated_at": old.updated_at},
        )
        return self._running(old.key, result.item) if result.ok else None

    def _running(self, key: str, item: Mapping[str, object] | None) -> Claim:
        if item is None:  # pragma: no cover - DynamoDB returns ALL_NEW on success
            raise LedgerUnavailable(f"claim of {key!r} succeeded but returned no item")
        record = parse_record(item)
        claim = Claim("run", key, token=record.token, record=record)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - claim is a coroutine
            return claim
        self._progress[(key, record.token)] = _ProgressState(loop=loop, claim=claim)
        return claim

    # ------------------------------------------------------------------------------------- running attempts

    async def renew(self, claim: Claim, *, lease_s: float) -> bool:
        """Extend the lease to ``lease_s`` from now. False when the lease was taken over (stop the work)."""
        now_ms = self._now_ms()
        lease_ms = now_ms + math.ceil(lease_s * 1000)
        result = await self._owned_write(
            claim,
            Update(
                assign={
                    "lease_expires_at_ms": lease_ms,
                    "expiration": self._expiration(now_ms, lease_ms),
                    "updated_at": now_ms,
                }
            ),
        )
        if not result:
            await self._settle_progress(claim)
        return result

    async def complete(self, claim: Claim, *, result: Any = None) -> bool:
        """Mark COMPLETED with the (size-capped) result. False when the lease was lost: nothing written."""
        state = await self._settle_progress(claim)
        now_ms = self._now_ms()
        result_text, result_note = encode_result(result, max_bytes=self._result_max_bytes)
        assign: dict[str, object] = {
            "status": Status.COMPLETED.value,
            "lease_expires_at_ms": 0,
            "expiration": self._expiration(now_ms, now_ms),
            "updated_at": now_ms,
        }
        remove = []
        for name, value in (("result", result_text), ("result_note", result_note)):
            if value is None:
                remove.append(name)
            else:
                assign[name] = value
        self._add_pending_progress(assign, state)
        ok, old = await self._owned_write_detail(claim, Update(assign=assign, remove=tuple(remove)))
        if ok:
            return True
        # A retried request whose first try went through: the item is already COMPLETED by this attempt.
        return old is not None and old.status is Status.COMPLETED and self._is_mine(old, claim)

    async def release(self, claim: Claim, *, error: str) -> None:
        """Give the key back after a retryable failure: lease and owner cleared, attempts and last_error kept."""
        state = await self._settle_progress(claim)
        now_ms = self._now_ms()
        assign: dict[str, object] = {
            "lease_expires_at_ms": 0,
            "last_error": truncate(error, MAX_ERROR_CHARS),
            "expiration": self._expiration(now_ms, now_ms),
            "updated_at": now_ms,
        }
        self._add_pending_progress(assign, state)
        ok, _ = await self._owned_write_detail(claim, Update(assign=assign, remove=("owner",)))
        if not ok:
            logger.info("idempotency key %r: release skipped, the lease was taken over", claim.key)

    async def fail(self, claim: Claim, *, error: str) -> None:
        """Mark FAILED (permanent error or attempts exhausted) with the last error."""
        state = await self._settle_progress(claim)
        now_ms = self._now_ms()
        assign: dict[str, object] = {
            "status": Status.FAILED.value,
            "lease_expires_at_ms": 0,
            "last_error": truncate(error, MAX_ERROR_CHARS),
            "expiration": self._expiration(now_ms, now_ms),
            "updated_at": now_ms,
        }
        self._add_pending_progress(assign, state)
        ok, _ = await self._owned_write_detail(claim, Update(assign=assign))
        if not ok:
            logger.info("idempotency key %r: failure not recorded, the lease was taken over", claim.key)

    async def get(self, key: str) -> Record | None:
        item = await self._store.get(key)
        return parse_record(item) if item is not None else None

    # -------------------------------------------------------------------------------------------- progress

    def progress(self, claim: Claim, percent: float, note: str | None) -> None:
        """Record progress without blocking; callable from any thread.

        Writes are rate-limited to one per ``progress_min_interval_s`` per claim; the latest value wins, and a
        value still pending when the attempt ends goes out with complete/release/fail (no extra write).
        """
        if claim.token is None:
            return
        state = self._progress.get((claim.key, claim.token))
        if state is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        value = (float(percent), truncate(note, MAX_NOTE_CHARS) if note is not None else None)
        if running is state.loop:
            self._on_progress(state, value)
            return
        try:
            state.loop.call_soon_threadsafe(self._on_progress, state, value)
        except RuntimeError:  # the loop is closed: the attempt is over
            return

    async def aclose(self) -> None:
        """Cancel pending progress timers and wait for progress writes in flight (call before closing the client)."""
        states = list(self._progress.values())
        self._progress.clear()
        for state in states:
            await self._close_progress(state)

    def _on_progress(self, state: _ProgressState, value: tuple[float, str | None]) -> None:
        if state.closed:
            return
        state.pending = value
        self._schedule_progress(state)

    def _schedule_progress(self, state: _ProgressState) -> None:
        if state.closed or state.pending is None or state.writing is not None or state.timer is not None:
            return
        delay_s = progress_delay_s(
            now_s=state.loop.time(), last_write_s=state.last_write_s, min_interval_s=self._progress_min_interval_s
        )
        if delay_s > 0:
            state.timer = state.loop.call_later(delay_s, self._on_progress_timer, state)
            return
        value, state.pending = state.pending, None
        state.last_write_s = state.loop.time()
        state.writing = state.loop.create_task(self._write_progress(state, value))
        state.writing.add_done_callback(lambda _task: self._on_progress_written(state))

    def _on_progress_timer(self, state: _ProgressState) -> None:
        state.timer = None
        self._schedule_progress(state)

    def _on_progress_written(self, state: _ProgressState) -> None:
        state.writing = None
        self._schedule_progress(state)

    async def _write_progress(self, state: _ProgressState, value: tuple[float, str | None]) -> None:
        percent, note = value
        assign: dict[str, object] = {"progress": percent, "updated_at": self._now_ms()}
        remove: tuple[str, ...] = ()
        if note is None:
            remove = ("progress_note",)
        else:
            assign["progress_note"] = note
        try:
            owned = await self._owned_write(state.claim, Update(assign=assign, remove=remove))
        except LedgerUnavailable as exc:
            logger.warning("idempotency key %r: progress not recorded: %s", state.claim.key, exc)
            return
        state.writes += 1
        if not owned:
            state.closed = True
            self._progress.pop((state.claim.key, state.claim.token or 0), None)

    async def _settle_progress(self, claim: Claim) -> _ProgressState | None:
        """Stop progress writes of this attempt; returns its state so a pending value joins the final write."""
        state = self._progress.pop((claim.key, claim.token), None) if claim.token is not None else None
        if state is not None:
            await self._close_progress(state)
        return state

    @staticmethod
    async def _close_progress(state: _ProgressState) -> None:
        state.closed = True
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if state.writing is not None and asyncio.get_running_loop() is state.loop:
            await asyncio.shield(state.writing)

    @staticmethod
    def _add_pending_progress(assign: dict[str, object], state: _ProgressState | None) -> None:
        if state is None or state.pending is None:
            return
        percent, note = state.pending
        state.pending = None
        assign["progress"] = percent
        if note is not None:
            assign["progress_note"] = note

    # -------------------------------------------------------------------------------------------- plumbing

    async def _owned_write(self, claim: Claim, update: Update) -> bool:
        ok, _ = await self._owned_write_detail(claim, update)
        return ok

    async def _owned_write_detail(self, claim: Claim, update: Update) -> tuple[bool, Record | None]:
        if claim.outcome != "run" or claim.token is None:
            raise ValueError(f"claim of {claim.key!r} is {claim.outcome!r}, not a running attempt")
        result = await self._store.update(
            claim.key,
            update,
            condition=OWNED_CONDITION,
            values={"in_progress": Status.IN_PROGRESS.value, "owner": self.owner, "token": claim.token},
        )
        old = parse_record(result.item) if not result.ok and result.item is not None else None
        return result.ok, old

    def _is_mine(self, record: Record, claim: Claim) -> bool:
        return record.owner == self.owner and record.token == claim.token

    def _claim_values(self, now_ms: int, payload_hash: str) -> dict[str, object]:
        return {
            "now_ms": now_ms,
            "now_s": now_ms // 1000,
            "payload_hash": payload_hash,
            "in_progress": Status.IN_PROGRESS.value,
            "failed": Status.FAILED.value,
        }

    def _expiration(self, now_ms: int, lease_ms: int) -> int:
        """TTL (epoch s): ``ttl_s`` after this write, and never before the lease ends."""
        return max(now_ms // 1000 + self._ttl_s, math.ceil(lease_ms / 1000) + 1)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
