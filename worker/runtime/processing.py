"""One held message run to its outcome: its envelope read, its due time, its rate limit and circuit breaker
(``worker.flow.gate``), its idempotency claim, its handler through the middleware, and the outcome applied
(``worker.runtime.outcomes``). The consume loop (``worker.runtime.worker``) receives, schedules and shuts down;
it hands each started message to :meth:`Processor.process`, and one cancelled past the shutdown grace to
:meth:`Processor.abandon`."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from worker.context import JobContext
from worker.envelope import INVALID_MESSAGE
from worker.errors import InvalidMessage, LedgerUnavailable
from worker.flow.delays import DUE_AT_ATTRIBUTE, due_action, due_at_of, too_far_ahead
from worker.flow.gate import Gate, Outcome, Step, flow_keys
from worker.jobs import Registry
from worker.lifecycle import Resources
from worker.middleware import CallNext, call_through
from worker.observability.events import Kind
from worker.observability.tracing import attempt_span
from worker.policy import BUG, EXHAUSTED, PERMANENT, Action, describe_error
from worker.runtime.clock import Clock
from worker.runtime.connectivity import Connectivity
from worker.runtime.execution import (
    PreparedJob,
    build_context,
    call_handler,
    judge_failure,
    prepare,
    result_for_ledger,
)
from worker.runtime.held import Held
from worker.runtime.outcomes import CANCELLED_AT_SHUTDOWN, NOT_YET_DUE, SHUTDOWN, Outcomes
from worker.runtime.steps import WorkflowSteps
from worker.runtime.threads import JobThreads

if TYPE_CHECKING:
    from worker.backends.protocols import MessageQueue
    from worker.idempotency import Claim, Ledger
    from worker.workflows import WorkflowHooks

log = logging.getLogger("worker")

#: How long a message waits before another try when the idempotency table is unreachable.
LEDGER_RETRY_S = 10


class Processor:
    """Runs held messages to their outcomes for one worker. ``finish`` applies an outcome shielded from
    cancellation (and frees the message's slot), ``forget`` frees the slot of a message whose outcome this
    task applies itself, ``release_delay_s`` is the visibility a message is put back with (longer while a long
    poll abandoned at shutdown may still take it)."""

    def __init__(
        self,
        *,
        registry: Registry,
        queue: MessageQueue,
        visibility_timeout_s: int,
        max_hop_s: int,
        outcomes: Outcomes,
        threads: JobThreads,
        gate: Gate,
        dynamodb: Connectivity,
        clock: Clock,
        rng: random.Random,
        finish: Callable[[Held, Coroutine[Any, Any, None]], Awaitable[None]],
        forget: Callable[[Held], None],
        release_delay_s: Callable[[], int],
        stopping: Callable[[], bool] = lambda: False,
        ledger: Ledger | None = None,
        workflows: WorkflowHooks | None = None,
    ) -> None:
        self.registry = registry
        self.queue = queue
        self.visibility_timeout_s = visibility_timeout_s
        self.max_hop_s = max_hop_s
        self.outcomes = outcomes
        self.ledger = ledger
        self.workflows = workflows
        self.gate = gate
        self.clock = clock
        self._steps = WorkflowSteps(workflows, queue_name=queue.name)
        self._threads = threads
        self._dynamodb = dynamodb
        self._rng = rng
        self._finish = finish
        self._forget = forget
        self._release_delay_s = release_delay_s
        #: Whether the worker is shutting down: a job not started by then is put back, not started.
        self._stopping = stopping
        self._warned_unguarded = False
        #: What the registry's lifespans yielded, while the worker runs (``ctx.resources``).
        self.resources = Resources()

    async def process(self, held: Held) -> bool:
        """Run one message to its outcome. True when the job succeeded (or was a completed duplicate)."""
        message = held.message
        if self.outcomes.acknowledged(message.message_id):
            # Its job ended here, but the delete had not gone through when SQS handed it out again: delete this
            # copy, do not run it again.
            await self._finish(held, self.outcomes.ack(held))
            self._emit(Kind.DUPLICATE_SKIPPED, held, reason="its job ended here; the delete had not gone through")
            return True
        decided = self.outcomes.decided(message.message_id)
        if decided is not None:  # decided dead before (its dead-letter send or delete did not go through)
            held.job_type = decided.job_type
            held.workflow_id = decided.workflow_id
            await self._finish(held, self.outcomes.dead_letter(held, decided.category, decided.error))
            return False
        try:
            job = prepare(message.body, self.registry)
        except InvalidMessage as exc:
            held.job_type = exc.job_type  # a registered type's refused payload; never a producer's unregistered name
            if not await self._steps.refused(held, exc):
                await self._finish(held, self._workflow_retry(held))
                return False
            await self._finish(held, self.outcomes.dead_letter(held, exc.category, str(exc)))
            return False
        except Exception as exc:  # a payload model's validator that raises something else: the job's bug
            await self._finish(held, self.outcomes.dead_letter(held, BUG, "payload model: " + describe_error(exc)))
            return False
        held.job_type = job.spec.name
        if job.envelope.workflow is not None:
            held.workflow_id = job.envelope.workflow.id
            if self.workflows is None or self.ledger is None:
                reason = "a workflow step needs WORKER_IDEMPOTENCY_TABLE (the workflow's state is kept there)"
                await self._finish(held, self.outcomes.dead_letter(held, PERMANENT, reason))
                return False
        verdict = await self._due(held)
        if verdict is not None:
            return verdict
        if self.ledger is None and job.envelope.idempotency_key is not None and not self._warned_unguarded:
            self._warned_unguarded = True
            log.warning("messages carry idempotency keys but WORKER_IDEMPOTENCY_TABLE is not set: they run unguarded")
        verdict = await self._admit(held, job)
        if verdict is not None:
            return verdict
        return await self._execute(held, job)

    async def _admit(self, held: Held, job: PreparedJob) -> bool | None:
        """Between a due job and its handler: the gate, the idempotency claim, and a shutdown that came meanwhile
        (the job is then put back, not started). None: run it now; a bool: the outcome is settled."""
        if self._stopping():  # the signal came while it waited for its due time
            await self._finish(held, self.outcomes.hold_back(held, self._release_delay_s(), SHUTDOWN))
            return False
        if (job.spec.rate is not None or job.spec.breaker is not None) and not await self._pass_gate(held, job):
            return False
        if self.ledger is not None:
            verdict = await self._claim(held, job)
            if verdict is not None:
                await self._report_flow(held, Outcome.NOT_COUNTED)  # a breaker's probe that did not run: let go
                return verdict
        if self._stopping():  # the signal came while the gate or the ledger answered: give both back
            await self._report_flow(held, Outcome.NOT_COUNTED)
            await self._ledger_settle(held, "not started: the worker was shutting down", final=False)
            await self._finish(held, self.outcomes.hold_back(held, self._release_delay_s(), SHUTDOWN))
            return False
        return None

    async def _due(self, held: Held) -> bool | None:
        """None when the job is due now (after waiting out less than a second); a bool: the outcome is settled. A job
        due later is sent on one more hop, unrun and uncounted (True: not a failure); a malformed due time, one more
        than a year ahead, or one on a FIFO queue, is ``invalid_message`` (False)."""
        try:
            due_at = due_at_of(held.message.message_attributes)
        except ValueError as exc:
            await self._finish(held, self.outcomes.dead_letter(held, INVALID_MESSAGE, f"bad {DUE_AT_ATTRIBUTE}: {exc}"))
            return False
        if due_at is not None and held.queue_or(self.queue).is_fifo:
            error = f"{DUE_AT_ATTRIBUTE} on a FIFO queue: FIFO queues take no per-message delay"
            await self._finish(held, self.outcomes.dead_letter(held, INVALID_MESSAGE, error))
            return False
        far = too_far_ahead(due_at, now=self._now()) if due_at is not None else None
        if far is not None:
            await self._finish(held, self.outcomes.dead_letter(held, INVALID_MESSAGE, far))
            return False
        action = due_action(due_at=due_at, now=self._now(), max_hop_s=self.max_hop_s)
        while action.action == "wait":  # the loop's monotonic clock may wake a hair before the wall clock's due time
            await asyncio.sleep(action.seconds)
            action = due_action(due_at=due_at, now=self._now(), max_hop_s=self.max_hop_s)
        if action.action == "hop":
            await self._finish(held, self.outcomes.hold_back(held, math.ceil(action.seconds), NOT_YET_DUE))
            return True
        return None

    async def _pass_gate(self, held: Held, job: PreparedJob) -> bool:
        """The job's circuit breaker and rate limit (worker.flow.gate): True to go on (after waiting for a reserved
        start); False when the message was held back with a delay (nothing failed) or its key function raised."""
        try:
            rate_key, breaker_key = flow_keys(job.spec, job.payload)
        except Exception as exc:  # the key function raised: the job's bug
            await self._finish(held, self.outcomes.dead_letter(held, BUG, "flow key: " + describe_error(exc)))
            return False
        try:
            decision = await self.gate.admit(
                job_type=job.spec.name,
                rate=job.spec.rate,
                rate_key=rate_key,
                breaker=job.spec.breaker,
                breaker_key=breaker_key,
                message_id=held.message.message_id,
                timeout_s=job.spec.timeout_s,
            )
        except LedgerUnavailable as exc:  # fail closed, as the ledger does
            self._dynamodb.down(exc)
            await self._finish(held, self.outcomes.hold_back(held, LEDGER_RETRY_S, "flow table unreachable"))
            return False
        if decision.step is Step.HOLD:
            await self._finish(held, self.outcomes.hold_back(held, decision.delay_s, decision.reason))
            return False
        held.ticket = decision.ticket
        return True

    async def _report_flow(self, held: Held, outcome: Outcome) -> None:
        """Tell the job's circuit breaker how it ended; a table that cannot take it loses this one count."""
        if held.ticket is None or held.job_type is None:
            return
        try:
            await self.gate.report(held.ticket, outcome, job_type=held.job_type)
        except LedgerUnavailable as exc:
            self._dynamodb.down(exc)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.time(), UTC)

    async def _claim(self, held: Held, job: PreparedJob) -> bool | None:
        """Take the job's idempotency claim. None: go ahead and run it; a bool: the outcome is settled."""
        from worker.idempotency import job_key, payload_hash

        assert self.ledger is not None
        try:
            key = job_key(job.spec, job.envelope, job.payload)
            digest = payload_hash(job.spec.name, job.envelope.payload) if key is not None else ""
        except InvalidMessage as exc:  # input no key can be made of (a lone surrogate): decided once
            await self._finish(held, self.outcomes.dead_letter(held, exc.category, str(exc)))
            return False
        except Exception as exc:  # the key function raised: the job's bug
            await self._finish(held, self.outcomes.dead_letter(held, BUG, "idempotency key: " + describe_error(exc)))
            return False
        if key is None:
            return None
        try:
            claim = await self.ledger.claim(
                key=key,
                job_type=job.spec.name,
                payload_hash=digest,
                lease_s=self.visibility_timeout_s,
            )
        except LedgerUnavailable as exc:
            self._dynamodb.down(exc)
            await self._finish(held, self.outcomes.hold_back(held, LEDGER_RETRY_S, "idempotency table unreachable"))
            return False
        self._dynamodb.up()
        if claim.outcome == "completed":
            if job.envelope.workflow is not None:  # its workflow may not have advanced yet (a crash in between)
                from worker.workflows import recorded_result

                advanced = self._steps.succeeded(held, job.envelope, recorded_result(claim.record, key))
                if not await asyncio.shield(advanced):
                    await self._finish(held, self._workflow_retry(held))
                    return False
            await self._finish(held, self.outcomes.ack(held))
            self._emit(Kind.DUPLICATE_SKIPPED, held, idempotency_key=key)
            return True
        if claim.outcome == "busy":
            delay_s = math.ceil(claim.retry_after_s or self.visibility_timeout_s)
            await self._finish(held, self.outcomes.hold_back(held, delay_s, "idempotency lease held elsewhere"))
            return False
        if claim.outcome == "conflict":
            reason = claim.reason or "idempotency key reused with another payload"
            await self._finish(held, self.outcomes.dead_letter(held, PERMANENT, reason))
            return False
        held.claim = claim
        return None

    async def _execute(self, held: Held, job: PreparedJob) -> bool:
        message = held.message
        attempt = held.attempt
        progress = None
        if held.claim is not None and self.ledger is not None:
            ledger, claim = self.ledger, held.claim

            def progress(percent: float, note: str | None) -> None:
                ledger.progress(claim, percent, note)

        context = build_context(
            job,
            message_id=message.message_id,
            attempt=attempt,
            progress=progress,
            receive_count=held.receive_count,
            resources=self.resources,
        )
        if held.claim is not None and job.envelope.idempotency_key is None:
            context.idempotency_key = held.claim.key  # derived (key function or payload hash)
        with attempt_span(held, job_type=job.spec.name, queue=self.queue.name):
            return await self._run_handler(held, job, context)

    async def _run_handler(self, held: Held, job: PreparedJob, context: JobContext) -> bool:
        """Call the handler through the middleware and apply the outcome. True when the job succeeded."""
        message = held.message
        sent_ms = message.sent_timestamp_ms
        queue_wait_s = max(0.0, self.clock.time() - sent_ms / 1000) if sent_ms else None
        self._emit(Kind.STARTED, held, queue_wait_s=queue_wait_s)
        started = self.clock.monotonic()
        handler = functools.partial(call_handler, job, context, self._threads, owner=held)
        try:
            result = await self._call_through(held, context, handler)
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the worker cancelled this job (shutdown past the grace period)
            if held.lease_lost:
                # Another worker took the job over: it owns the message and the outcome now; touch neither. A
                # breaker's probe is given back: that worker's gate would hold the job behind it for its lease.
                await self._report_flow(held, Outcome.NOT_COUNTED)
                return False
            # Nobody in the worker cancelled it: the handler raised CancelledError itself. That is the job's
            # failure (retried with backoff, counted), not a shutdown.
            await self._finish(held, self._failed(held, job, exc, self.clock.monotonic() - started))
            return False
        except Exception as exc:
            await self._finish(held, self._failed(held, job, exc, self.clock.monotonic() - started))
            return False
        duration_s = self.clock.monotonic() - started
        if (
            held.claim is None
            and held.ticket is None
            and job.envelope.workflow is None
            and (held.extension is None or held.extension.done())
        ):
            await self._acknowledge_now(held, duration_s)
        else:
            await self._finish(held, self._succeeded(held, job, result, duration_s))
        return True

    async def _call_through(self, held: Held, context: JobContext, handler: CallNext) -> Any:
        """Middleware and handler, in this job's own task (no task of their own: the handler starts in the same
        step as the receive that brought it, ahead of the next receive's request). A lost lease cancels this task
        while they run (``Held.stop_handler``); ``Held.end_handler`` takes those cancellations back."""
        task = asyncio.current_task()
        assert task is not None
        held.handler = task
        try:
            return await call_through(self.registry.middlewares, context, handler)
        finally:
            held.end_handler()

    async def _acknowledge_now(self, held: Held, duration_s: float) -> None:
        """A plain success (no ledger, workflow, gate or heartbeat in flight), in this task rather than a shielded
        one: ``ack`` does not wait before it hands the delete to its queue (a batch entry, or the memory queue's
        delete), and a handed-over delete is done whatever happens to the task (shutdown drains the batches)."""
        held.finishing = True
        self._forget(held)
        await self.outcomes.ack(held)
        self._emit(Kind.SUCCEEDED, held, duration_s=duration_s)

    async def _succeeded(self, held: Held, job: PreparedJob, result: Any, duration_s: float) -> None:
        """The handler succeeded: settle the message, then tell its breaker, whatever the settling did (a probe
        that succeeded and then met a ledger that could not record it, a lost claim or a workflow state not
        written, kept its breaker half-open, every job of the key held, for the probe's lease)."""
        await self._settle_success(held, job, result, duration_s)
        await self._report_flow(held, Outcome.SUCCEEDED)

    async def _settle_success(self, held: Held, job: PreparedJob, result: Any, duration_s: float) -> None:
        if held.claim is not None and self.ledger is not None:
            try:
                fenced_ok = await self._complete_claim(held.claim, result_for_ledger(result))
            except LedgerUnavailable as exc:
                # The effect happened but is not recorded: leave the message to reappear. Its claim lapses
                # with the lease and the next attempt runs again; keep downstream calls idempotent by key.
                self._dynamodb.down(exc)
                log.error("could not record completion; the job may run again", extra=held.log_fields(self.queue.name))
                return
            if not fenced_ok:
                self._emit(Kind.CLAIM_LOST, held, reason="idempotency lease was taken over; not acknowledged")
                return
        if not await self._steps.succeeded(held, job.envelope, result_for_ledger(result)):
            await self._workflow_retry(held)
            return
        await self.outcomes.ack(held)
        self._emit(Kind.SUCCEEDED, held, duration_s=duration_s)

    async def _complete_claim(self, claim: Claim, result: Any) -> bool:
        """Record completion (the ledger retries it within its budget: a lost completion means the job runs again)."""
        assert self.ledger is not None
        return await self.ledger.complete(claim, result=result)

    async def _failed(self, held: Held, job: PreparedJob, error: BaseException, duration_s: float) -> None:
        decision, text = judge_failure(
            job, error, attempt=held.attempt, max_attempts=job.spec.max_attempts, rng=self._rng
        )
        counted = decision.action is Action.RETRY or decision.category == EXHAUSTED
        if decision.action is not Action.RETRY and not await self._steps.failed(held, job.envelope, text):
            await self._ledger_settle(held, text, final=False)
            await self._workflow_retry(held)
            await self._report_flow(held, Outcome.COUNTED if counted else Outcome.NOT_COUNTED)
            return
        if decision.action is Action.RETRY:
            assert decision.delay_s is not None
            await self._ledger_settle(held, text, final=False)
            await self.outcomes.retry(held, decision.delay_s, text, duration_s)
        else:
            assert decision.category is not None
            await self._ledger_settle(held, text, final=True)
            await self.outcomes.dead_letter(held, decision.category, text, duration_s=duration_s)
        await self._report_flow(held, Outcome.COUNTED if counted else Outcome.NOT_COUNTED)

    async def _workflow_retry(self, held: Held) -> None:
        """The workflow's state could not be written: the message comes back later and tells it again."""
        await self.outcomes.release(held, delay_s=LEDGER_RETRY_S, reason="workflow state unreachable")

    async def _ledger_settle(self, held: Held, error: str, *, final: bool) -> None:
        if held.claim is None or self.ledger is None:
            return
        try:
            if final:
                await self.ledger.fail(held.claim, error=error)
            else:
                await self.ledger.release(held.claim, error=error)
        except LedgerUnavailable as exc:
            self._dynamodb.down(exc)  # the lease lapses by itself; the retry takes the claim over

    async def abandon(self, held: Held) -> None:
        """The job was cancelled (shutdown past the grace period): put the message back at once, unless its
        plain ``def`` handler still runs in a thread: released, it would run twice. It stays invisible until its
        visibility timeout; the thread ends with the process, before the handler completes. A circuit breaker's
        probe is given back (not counted): the next job of its key probes, rather than wait out its lease."""
        await self._report_flow(held, Outcome.NOT_COUNTED)
        if self._threads.is_running(held):
            log.warning(
                "a plain def handler still runs at exit: its message is not released and reappears after its "
                "visibility timeout",
                extra=held.log_fields(self.queue.name),
            )
            return
        await self._ledger_settle(held, "cancelled at shutdown", final=False)
        await self.outcomes.hold_back(held, self._release_delay_s(), CANCELLED_AT_SHUTDOWN)

    def _emit(self, kind: Kind, held: Held, **fields: Any) -> None:
        self.outcomes.emit(kind, held, **fields)
