"""Running one Cloud Tasks delivery to its answer, on the worker's one execution path.

The steps are those of ``worker.runtime.worker`` for an SQS message: ``prepare`` (envelope, job type, payload
model), the idempotency claim in the ledger, ``build_context`` and ``call_handler`` (timeout, threads for plain
``def`` handlers), ``classify_failure`` (retry or dead-letter, with the same categories), the ledger's
completion / release / failure, and the same events to the same observers (logs, metrics, health). Only the
acknowledgement differs: an HTTP status (see ``contract``) instead of a delete or a visibility change, and dead
letters go to the worker's own store (``deadletters``) since Cloud Tasks has none.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.backends.cloudtasks.contract import (
    Reply,
    TaskRequest,
    done,
    effective_max_attempts,
    is_last_attempt,
    not_now,
    retry,
)
from worker.backends.cloudtasks.deadletters import DeadLetterStore, make_record
from worker.envelope import INVALID_MESSAGE
from worker.errors import ConfigError, InvalidMessage, LedgerUnavailable, QueueUnavailable, RetryableError
from worker.jobs import Registry
from worker.lifecycle import Resources
from worker.middleware import call_through
from worker.observability.events import Event, Kind, Observers
from worker.policy import BUG, EXHAUSTED, PERMANENT, Action, describe_error
from worker.runtime.connectivity import Connectivity
from worker.runtime.execution import (
    PreparedJob,
    build_context,
    call_handler,
    judge_failure,
    prepare,
    result_for_ledger,
)
from worker.runtime.processing import LEDGER_RETRY_S
from worker.runtime.threads import JobThreads
from worker.runtime.worker import THREAD_FINISH_WAIT_S

if TYPE_CHECKING:
    from worker.idempotency import Claim, Ledger

log = logging.getLogger("worker")

#: Retry-After of a delivery that found no free slot, or came during shutdown.
BUSY_RETRY_S = 1
#: The reasons of a last attempt that shutdown kept from running to its end (Cloud Tasks would drop it).
SHUTDOWN_AT_LAST = "not run: the worker was shutting down at the task's last attempt"
CANCELLED_AT_LAST = "cancelled at shutdown (past WORKER_SHUTDOWN_GRACE_S) on the task's last attempt"
#: An idempotency lease lasts this long and is renewed every LEASE_RENEW_S while its request runs: a crashed
#: instance's key is free again within a minute, not after the handler's whole timeout.
LEASE_S = 60
LEASE_RENEW_S = 20
#: Dead-letter decisions (and completions not yet recorded) remembered by task name, so a redelivery is recorded
#: again without running.
MAX_DECIDED = 1_000


@dataclass(frozen=True)
class RunnerOptions:
    queue: str
    queue_max_attempts: int = 100
    concurrency: int = 10
    dead_letter_write_s: float = 60.0


class TaskRunner:
    """Answers deliveries of one queue with the handlers of ``registry``; at most ``concurrency`` run at once."""

    def __init__(
        self,
        *,
        registry: Registry,
        options: RunnerOptions,
        dead_letters: DeadLetterStore,
        observers: Observers | None = None,
        ledger: Ledger | None = None,
        threads: JobThreads | None = None,
        rng: random.Random | None = None,
        resources: Resources | None = None,
    ) -> None:
        self.registry = registry
        self.resources = resources if resources is not None else Resources()
        self.options = options
        self.dead_letters = dead_letters
        self.observers = observers or Observers()
        self.ledger = ledger
        self.threads = threads or JobThreads(options.concurrency)
        self._rng = rng or random.Random()
        self._slots = asyncio.Semaphore(options.concurrency)
        self._running = 0
        self._jobs: set[asyncio.Task[Reply]] = set()
        self._decided: OrderedDict[str, tuple[str, str, str | None, int]] = OrderedDict()
        self._unrecorded: OrderedDict[str, tuple[Claim, Any, str]] = OrderedDict()
        self.stopping = False
        self._dynamodb = Connectivity("dynamodb", self.observers, monotonic=time.monotonic)

    # ------------------------------------------------------------------------------------------- the edge

    @property
    def in_flight(self) -> int:
        return self._running

    def gauge(self) -> None:
        self.observers.gauge(
            in_flight=self._running,
            free_slots=self.options.concurrency - self._running,
            stuck_threads=self.threads.stuck,
        )

    async def answer(self, request: TaskRequest) -> Reply:
        """The reply to one delivery. The job runs in a task of its own, shielded from the request's cancellation
        (a client that hangs up does not cut its bookkeeping short); ``drain`` waits for it at shutdown."""
        if self.stopping:
            return await self._deliver(request, refuse=True)
        job = asyncio.ensure_future(self._deliver(request))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if job.cancelled() and (current is None or not current.cancelling()):
                return not_now("cancelled_at_shutdown", retry_after_s=BUSY_RETRY_S)  # cancelled before it ran
            raise

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new deliveries, let running jobs finish within ``grace_s``, then cancel the rest
        (their deliveries answer 503: Cloud Tasks tries them again)."""
        self.stopping = True
        running = set(self._jobs)
        if running:
            log.info("waiting up to %.0f s for %d running job(s)", grace_s, len(running))
            _, pending = await asyncio.wait(running, timeout=grace_s)
            if pending:
                self.threads.wait_on_cancel(THREAD_FINISH_WAIT_S)
                for task in pending:
                    task.cancel()
                log.warning("cancelled %d job(s) still running after the grace period", len(pending))
                await asyncio.gather(*pending, return_exceptions=True)
        self.threads.close()

    # ------------------------------------------------------------------------------------------- one delivery

    async def _deliver(self, request: TaskRequest, *, refuse: bool = False) -> Reply:
        """One delivery to its reply. ``refuse`` (shutting down): nothing runs; the last attempt is dead-lettered
        (Cloud Tasks would drop it), any other answered 503."""
        self._emit(Kind.RECEIVED, request, None)
        decided = self._decided.get(request.task_name)
        if decided is not None:  # decided dead before; its record may not have been written
            category, error, job_type, attempt = decided
            return await self._dead_letter(request, category, error, job_type=job_type, attempt=attempt)
        if request.task_name in self._unrecorded:  # it ran here; its completion is what is missing
            recorded = await self._record_completion(request, redelivered=True)
            if recorded is not None:
                return recorded
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return await self._dead_letter(request, INVALID_MESSAGE, f"body is not UTF-8: {exc.reason}")
        try:
            job = prepare(text, self.registry)
        except InvalidMessage as exc:
            return await self._dead_letter(request, exc.category, str(exc), job_type=exc.job_type)
        except Exception as exc:  # a payload model's validator that raises something else: the job's bug
            return await self._dead_letter(request, BUG, "payload model: " + describe_error(exc))
        max_attempts = effective_max_attempts(
            job_max_attempts=job.spec.max_attempts, queue_max_attempts=self.options.queue_max_attempts
        )
        last = is_last_attempt(request.attempt, max_attempts=max_attempts)
        if refuse:
            if last:
                return await self._dead_letter(request, EXHAUSTED, SHUTDOWN_AT_LAST, job_type=job.spec.name)
            self._emit(Kind.RELEASED, request, job.spec.name, delay_s=float(BUSY_RETRY_S), reason="shutting down")
            return not_now("shutting_down", retry_after_s=BUSY_RETRY_S)
        if self._running >= self.options.concurrency and not last:
            self._emit(Kind.RELEASED, request, job.spec.name, delay_s=float(BUSY_RETRY_S), reason="over capacity")
            return not_now("over_capacity", retry_after_s=BUSY_RETRY_S)
        try:
            await self._slots.acquire()  # the last attempt waits for a slot: a refusal would let Cloud Tasks drop it
        except asyncio.CancelledError:
            if last:  # shutdown came first: keep it as a dead letter
                return await self._dead_letter(request, EXHAUSTED, SHUTDOWN_AT_LAST, job_type=job.spec.name)
            raise
        self._running += 1
        try:
            return await self._run(request, job, max_attempts=max_attempts, last=last)
        finally:
            self._running -= 1
            self._slots.release()

    async def _run(self, request: TaskRequest, job: PreparedJob, *, max_attempts: int, last: bool) -> Reply:
        name = job.spec.name
        claim: Claim | None = None
        if self.ledger is not None:
            verdict = await self._claim(request, job, last=last)
            if isinstance(verdict, Reply):
                return verdict
            claim = verdict
        elif job.envelope.idempotency_key is not None:
            log.debug("idempotency key without WORKER_IDEMPOTENCY_TABLE: runs unguarded")
        progress = None
        if claim is not None and self.ledger is not None:
            ledger, running = self.ledger, claim

            def progress(percent: float, note: str | None) -> None:
                ledger.progress(running, percent, note)

        context = build_context(
            job, message_id=request.task_name, attempt=request.attempt, progress=progress, resources=self.resources
        )
        context.max_attempts = max_attempts
        if claim is not None and job.envelope.idempotency_key is None:
            context.idempotency_key = claim.key
        self._emit(Kind.STARTED, request, name)
        started = time.monotonic()
        renewing = asyncio.create_task(self._keep_lease(request, claim, name)) if claim is not None else None
        try:
            handler = functools.partial(call_handler, job, context, self.threads, owner=request)
            try:
                result = await call_through(self.registry.middlewares, context, handler)
            finally:
                if renewing is not None:  # before the outcome's own writes to the claim
                    renewing.cancel()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # shutdown past the grace
                await self._settle(claim, "cancelled at shutdown", final=last)
                if last:  # Cloud Tasks would drop it: keep it as a dead letter
                    return await self._dead_letter(request, EXHAUSTED, CANCELLED_AT_LAST, job_type=name)
                self._emit(Kind.RELEASED, request, name, delay_s=float(BUSY_RETRY_S), reason="cancelled at shutdown")
                return not_now("cancelled_at_shutdown", retry_after_s=BUSY_RETRY_S)
            return await self._failed(request, job, asyncio.CancelledError(), claim, max_attempts, started)
        except Exception as exc:
            return await self._failed(request, job, exc, claim, max_attempts, started)
        duration_s = time.monotonic() - started
        if claim is not None and self.ledger is not None:
            self._remember_unrecorded(request.task_name, (claim, result_for_ledger(result), name))
            recorded = await self._record_completion(request, duration_s=duration_s)
            if recorded is not None:
                return recorded
        self._emit(Kind.SUCCEEDED, request, name, duration_s=duration_s)
        return done("succeeded")

    async def _record_completion(
        self, request: TaskRequest, *, duration_s: float | None = None, redelivered: bool = False
    ) -> Reply | None:
        """Record the completion of the job this process ran for ``request``, right after the run or on a
        ``redelivered`` request after a failed write: the reply; None when the key was taken over before a
        redelivery (the delivery goes on as new)."""
        assert self.ledger is not None
        claim, result, name = self._unrecorded[request.task_name]
        try:
            completed = await self.ledger.complete(claim, result=result)
        except LedgerUnavailable as exc:
            self._dynamodb.down(exc)
            log.error(
                "could not record completion; the task comes back to record it (if this process is gone, the lease "
                "lapses and the job may run again)",
                extra=self._fields(request, name),
            )
            return not_now("completion_unrecorded", retry_after_s=LEDGER_RETRY_S)
        self._dynamodb.up()
        self._unrecorded.pop(request.task_name, None)
        if not completed:
            self._emit(Kind.CLAIM_LOST, request, name, reason="idempotency lease was taken over")
            return None if redelivered else not_now("claim_lost", retry_after_s=LEDGER_RETRY_S)
        self._emit(Kind.SUCCEEDED, request, name, duration_s=duration_s)
        return done("succeeded")

    async def _keep_lease(self, request: TaskRequest, claim: Claim, name: str) -> None:
        """Renew the claim's lease while the request runs (cancelled when it ends)."""
        assert self.ledger is not None
        while True:
            await asyncio.sleep(LEASE_RENEW_S)  # a fixed cadence, as the SQS heartbeat's
            try:
                if not await self.ledger.renew(claim, lease_s=LEASE_S):
                    self._emit(Kind.CLAIM_LOST, request, name, reason="idempotency lease was taken over")
                    return
            except LedgerUnavailable as exc:
                self._dynamodb.down(exc)

    async def _claim(self, request: TaskRequest, job: PreparedJob, *, last: bool) -> Claim | Reply | None:
        """The job's idempotency claim: None (no key: run unguarded), the claim (run), or the reply already due."""
        from worker.idempotency import job_key, payload_hash

        assert self.ledger is not None
        name = job.spec.name
        try:
            key = job_key(job.spec, job.envelope, job.payload)
            digest = payload_hash(name, job.envelope.payload) if key is not None else ""
        except InvalidMessage as exc:
            return await self._dead_letter(request, exc.category, str(exc), job_type=name)
        except Exception as exc:  # the key function raised: the job's bug
            return await self._dead_letter(request, BUG, "idempotency key: " + describe_error(exc), job_type=name)
        if key is None:
            return None
        try:
            claim = await self.ledger.claim(key=key, job_type=name, payload_hash=digest, lease_s=LEASE_S)
        except LedgerUnavailable as exc:
            self._dynamodb.down(exc)
            log.warning("idempotency table unreachable: %s", exc, extra=self._fields(request, name))
            return not_now("ledger_unreachable", retry_after_s=LEDGER_RETRY_S)
        self._dynamodb.up()
        if claim.outcome == "completed":
            self._emit(Kind.DUPLICATE_SKIPPED, request, name, idempotency_key=key)
            return done("duplicate")
        if claim.outcome == "conflict":
            return await self._dead_letter(
                request, PERMANENT, claim.reason or "idempotency key reused with another payload", job_type=name
            )
        if claim.outcome == "busy":
            if last:
                return await self._dead_letter(
                    request, EXHAUSTED, "idempotency lease held elsewhere at the last attempt", job_type=name
                )
            delay_s = math.ceil(claim.retry_after_s or LEDGER_RETRY_S)
            self._emit(Kind.RELEASED, request, name, delay_s=float(delay_s), reason="idempotency lease held elsewhere")
            return not_now("busy", retry_after_s=delay_s)
        return claim

    async def _failed(
        self,
        request: TaskRequest,
        job: PreparedJob,
        error: BaseException,
        claim: Claim | None,
        max_attempts: int,
        started: float,
    ) -> Reply:
        spec = job.spec
        duration_s = time.monotonic() - started
        decision, text = judge_failure(job, error, attempt=request.attempt, max_attempts=max_attempts, rng=self._rng)
        if decision.action is Action.RETRY:
            await self._settle(claim, text, final=False)
            named = error.delay_s if isinstance(error, RetryableError) else None
            reply = retry(text, delay_s=named)
            delay_s = float(reply.retry_after_s) if reply.retry_after_s is not None else None
            self._emit(Kind.RETRY_SCHEDULED, request, spec.name, delay_s=delay_s, error=text, duration_s=duration_s)
            return reply
        assert decision.category is not None
        await self._settle(claim, text, final=True)
        return await self._dead_letter(request, decision.category, text, job_type=spec.name, duration_s=duration_s)

    async def _settle(self, claim: Claim | None, error: str, *, final: bool) -> None:
        if claim is None or self.ledger is None:
            return
        try:
            if final:
                await self.ledger.fail(claim, error=error)
            else:
                await self.ledger.release(claim, error=error)
        except LedgerUnavailable:
            pass  # the lease lapses by itself; a later attempt takes the claim over

    async def _dead_letter(
        self,
        request: TaskRequest,
        category: str,
        error: str,
        *,
        job_type: str | None = None,
        duration_s: float | None = None,
        attempt: int | None = None,
    ) -> Reply:
        """Record the dead letter, then answer 2xx so Cloud Tasks stops. A record that cannot be written within
        ``dead_letter_write_s`` answers 503: the task comes back (while attempts remain) and is recorded without
        running again."""
        attempt = attempt or request.attempt  # a redelivery keeps the attempt that failed
        self._remember(request.task_name, (category, error, job_type, attempt))
        record = make_record(
            queue=self.options.queue,
            task=request.task_name,
            body=request.body,
            category=category,
            error=error,
            attempts=attempt,
            job_type=job_type,
        )
        try:
            await self.dead_letters.put_within(record, give_up_after_s=self.options.dead_letter_write_s)
        except (QueueUnavailable, ConfigError) as exc:
            self._dynamodb.down(exc)
            log.error(
                "dead-letter record not written (%s: %s); answering 503 so the task comes back: %s",
                category,
                error,
                exc,
                extra=self._fields(request, job_type),
            )
            return not_now("dead_letter_unrecorded", retry_after_s=LEDGER_RETRY_S, detail=category)
        self._dynamodb.up()
        self._emit(Kind.DEAD_LETTERED, request, job_type, category=category, error=error, duration_s=duration_s)
        return done("dead_lettered", detail=category)

    # ------------------------------------------------------------------------------------------- helpers

    def _remember(self, task: str, decision: tuple[str, str, str | None, int]) -> None:
        _bounded_put(self._decided, task, decision)

    def _remember_unrecorded(self, task: str, completion: tuple[Claim, Any, str]) -> None:
        _bounded_put(self._unrecorded, task, completion)

    def _emit(self, kind: Kind, request: TaskRequest, job_type: str | None, **fields: Any) -> None:
        self.observers.emit(
            Event(
                kind=kind,
                queue=self.options.queue,
                message_id=request.task_name,
                job_type=job_type,
                attempt=request.attempt,
                **fields,
            )
        )

    def _fields(self, request: TaskRequest, job_type: str | None) -> dict[str, Any]:
        return {"message_id": request.task_name, "job_type": job_type, "queue": self.options.queue}


def _bounded_put(memory: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Put ``key`` last in ``memory``, forgetting the oldest beyond MAX_DECIDED."""
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > MAX_DECIDED:
        memory.popitem(last=False)
