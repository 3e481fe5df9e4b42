"""The worker's event loop: receive loops, starts (prefetch, FIFO groups), heartbeats and a clean shutdown.

Lifecycle of a message: received (holds a slot, visibility claimed) -> started -> one outcome: acknowledged
(deleted), retried (visibility set to the backoff delay), dead-lettered (sent to the DLQ, then deleted), or
held back unrun (shutdown, a failure earlier in its FIFO group, a live idempotency lease elsewhere, not yet due:
``Outcomes.hold_back``, which costs the job no attempt).
Acknowledgements and bookkeeping are shielded from cancellation so a SIGTERM cannot skip them. One started
message is run to its outcome by ``worker.runtime.processing``; heartbeats live in ``worker.runtime.heartbeat``,
the SQS side of each outcome in ``worker.runtime.outcomes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.backends.protocols import Message, MessageQueue
from worker.budgets import RECEIVE, retry_delay_s
from worker.errors import ConfigError, QueueUnavailable
from worker.flow.attempts import counts_of
from worker.flow.delays import MAX_HOP_S
from worker.flow.gate import Gate, change_event
from worker.flow.priorities import Mode
from worker.jobs import Registry
from worker.lifecycle import open_lifespans
from worker.observability.events import Kind, Observers
from worker.runtime.clock import SYSTEM_CLOCK, Clock
from worker.runtime.connectivity import Connectivity
from worker.runtime.heartbeat import EXTEND_BELOW_SHARE, Heartbeat
from worker.runtime.held import Held
from worker.runtime.outcomes import SHUTDOWN, Outcomes
from worker.runtime.processing import Processor
from worker.runtime.queueset import Receivers, Route
from worker.runtime.slots import Slots, receive_loops
from worker.runtime.starts import Starts
from worker.runtime.threads import JobThreads

if TYPE_CHECKING:
    from worker.idempotency import Ledger
    from worker.workflows import WorkflowHooks

log = logging.getLogger("worker")

#: How long a message waits before another try after an internal error of the worker.
INTERNAL_ERROR_RETRY_S = 30
#: A held message is not started with less of its claim left than this (a tenth of a shorter visibility timeout):
#: SQS may hand it to another worker before a heartbeat could extend it. Healthy claims keep more: heartbeats extend
#: them with half the timeout left.
START_MARGIN_S = 1.0
#: A receive still unanswered after this gives its slots back to the other receive loops (see _receive_loop).
HEDGE_AFTER_S = 0.05
#: While the queue is busy, how long a receive loop waits for a full batch of free slots (see Slots.fill).
FILL_WAIT_S = 0.01
#: The same while another receive is in flight (its jobs will free slots): fewer partial receives.
FILL_WAIT_IN_FLIGHT_S = 0.05
#: After the shutdown grace, how long a plain ``def`` handler still running in its thread may still finish (and
#: its message be acknowledged) before the process exits without it.
THREAD_FINISH_WAIT_S = 2.0
#: At shutdown, how long outcomes still being applied (a dead letter being sent, a delete) may still take.
OUTCOME_FINISH_WAIT_S = 5.0


@dataclass(frozen=True)
class RuntimeOptions:
    concurrency: int = 10
    visibility_timeout_s: int = 30
    shutdown_grace_s: float = 30.0
    poll_wait_s: int = 20
    #: Messages held beyond ``concurrency``, received ahead and started as jobs end (``worker.runtime.starts``).
    prefetch: int = 0
    #: The longest hop of a long delay (SQS's DelaySeconds limit); shorter only in tests, never a setting.
    max_hop_s: int = MAX_HOP_S


class Worker:
    """Consumes one queue (``queue`` and its ``dlq``), or a set of them (``routes``, highest priority first, each
    with its own DLQ, shared by ``mode``: see ``worker.flow.priorities``), with the handlers of a registry.
    Clients come in through the MessageQueue objects."""

    def __init__(
        self,
        *,
        registry: Registry,
        queue: MessageQueue | None = None,
        dlq: MessageQueue | None = None,
        options: RuntimeOptions,
        observers: Observers | None = None,
        ledger: Ledger | None = None,
        rng: random.Random | None = None,
        workflows: WorkflowHooks | None = None,
        gate: Gate | None = None,
        routes: list[Route] | None = None,
        mode: Mode = Mode.WEIGHTED,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if routes is None:
            if queue is None or dlq is None:
                raise ValueError("give queue and dlq, or routes")
            routes = [Route(queue, dlq)]
        elif not routes or queue is not None or dlq is not None:
            raise ValueError("give queue and dlq, or routes (at least one), not both")
        self.registry = registry
        self.routes = routes
        self.queue = routes[0].queue
        self.dlq = routes[0].dlq
        self.clock = clock
        self.options = options
        self.observers = observers or Observers()
        self._rng = rng or random.Random()
        #: Messages held (claimed): ``concurrency`` plus the prefetch; ``_starts``: jobs running, at most
        #: ``concurrency``, and the held messages waiting to start.
        self._slots = Slots(options.concurrency + options.prefetch)
        self._starts: Starts[Held] = Starts(options.concurrency, self._start)
        self._receivers = Receivers(
            routes,
            mode=mode,
            slots=self._slots,
            hedge_after_s=HEDGE_AFTER_S,
            fill_wait_s=FILL_WAIT_S,
            fill_wait_in_flight_s=FILL_WAIT_IN_FLIGHT_S,
        )
        #: FIFO groups waiting their turn, by (queue URL, MessageGroupId).
        self._groups: dict[tuple[str, str], deque[Held]] = {}
        self._jobs: set[asyncio.Task[Any]] = set()
        #: Outcomes being applied (shielded: a job cancelled at shutdown leaves its outcome running; see _shutdown).
        self._applying: set[asyncio.Future[None]] = set()
        self._stopping = False
        #: When each receive in flight began (monotonic); at shutdown they are abandoned, not answered.
        self._polls: dict[asyncio.Future[list[Message]], float] = {}
        #: Until when a receive abandoned at shutdown may still take a message SQS makes visible (its long poll
        #: goes on at SQS although nobody reads its answer).
        self._abandoned_until = 0.0
        #: Threads for plain ``def`` handlers: one healthy thread per slot, whatever stuck threads do.
        self._threads = JobThreads(options.concurrency, monotonic=clock.monotonic)
        self._sqs = Connectivity("sqs", self.observers, monotonic=clock.monotonic)
        self._dynamodb = Connectivity("dynamodb", self.observers, monotonic=clock.monotonic)
        self.outcomes = Outcomes(
            queue=self.queue, dlq=self.dlq, observers=self.observers, max_hop_s=options.max_hop_s, clock=clock
        )
        self.heartbeat = Heartbeat(
            queue=self.queue,
            slots=self._slots,
            visibility_timeout_s=options.visibility_timeout_s,
            observers=self.observers,
            sqs=self._sqs,
            dynamodb=self._dynamodb,
            ledger=ledger,
            threads=self._threads,
            clock=clock,
        )
        self.fatal: BaseException | None = None
        #: Rate limits and circuit breakers (worker.flow): shared through the table, or this worker's own.
        #: On the worker's clock: the in-memory kit's skips pass for the gate's windows and cooldowns too.
        self.gate = gate if gate is not None else Gate(now_ms=lambda: int(clock.time() * 1000))
        self.gate.on_change = lambda change: self.observers.emit(change_event(change, self.queue.name))
        self._processor = Processor(
            registry=registry,
            queue=self.queue,
            visibility_timeout_s=options.visibility_timeout_s,
            max_hop_s=options.max_hop_s,
            outcomes=self.outcomes,
            threads=self._threads,
            gate=self.gate,
            dynamodb=self._dynamodb,
            clock=clock,
            rng=self._rng,
            finish=self._finish,
            forget=self._forget,
            release_delay_s=self._release_delay_s,
            stopping=lambda: self._stopping,
            ledger=ledger,
            workflows=workflows,
        )

    # ----------------------------------------------------------------------------------------------- running

    async def run(self, stop: asyncio.Event) -> None:
        """Start the lifespans, consume until ``stop`` is set, shut down cleanly, then stop the lifespans.
        Raises the error that stopped it, if any (a lifespan failing at start: ConfigError, nothing received)."""
        async with open_lifespans(self.registry.lifespans) as self._processor.resources:
            await self._consume(stop)

    async def _consume(self, stop: asyncio.Event) -> None:
        # By the concurrency, not the prefetch: an idle worker keeps as many long polls open with a prefetch as without
        # (each costs requests, and one still open at exit can take messages for a visibility timeout); a loop asks
        # for up to 10 messages per receive, so these keep the prefetched slots filled too.
        loops = receive_loops(self.options.concurrency) + len(self.routes) - 1  # one more per long poll of the set
        receivers = [asyncio.create_task(self._receive_loop(stop), name=f"receive-{i}") for i in range(loops)]
        heartbeat = asyncio.create_task(self.heartbeat.run(), name="heartbeat")
        names = ", ".join(route.queue.name for route in self.routes)
        log.info(
            "worker started on %s (concurrency %d, %d receive loop%s, long polls of %d s)",
            names if len(self.routes) == 1 else f"{names} ({self._receivers.policy.mode})",
            self.options.concurrency,
            loops,
            "" if loops == 1 else "s",
            self.options.poll_wait_s,
            extra={
                "queue": names,
                "dlq": ", ".join(route.dlq.name for route in self.routes),
                "job_types": self.registry.names(),
            },
        )
        try:
            await self.outcomes.check_dlq_sizes(self.routes)
            await stop.wait()
        finally:
            await self._shutdown(receivers, heartbeat)
        if self.fatal is not None:
            raise self.fatal

    async def _receive_loop(self, stop: asyncio.Event) -> None:
        """Receive for free slots until stopping, from the queue the priority policy names (``Receivers``). A
        receive unanswered after ``HEDGE_AFTER_S`` gives its slots back so another loop can use them: on a single
        queue only while it is busy (the last receive brought messages: an endpoint erring, retrying or stalled);
        in a set once it looks like a long poll on an empty queue (``Receivers.lend_after_s``: the other queues
        use the slots). What it brings back later takes the slots still free, the rest waits for one
        (``_place_later``). A failed receive pauses its loop by the RECEIVE budget of ``worker.budgets``."""
        failures = 0  # failed receives in a row
        while not self._stopping:
            route, index, reservation = await self._receivers.reserve()
            asked, lent = reservation.count, False
            receive = asyncio.ensure_future(
                route.queue.receive(
                    max_messages=asked,
                    wait_s=self.options.poll_wait_s,
                    visibility_timeout_s=self.options.visibility_timeout_s,
                )
            )
            self._polls[receive] = began = self.clock.monotonic()
            receive.add_done_callback(self._polls.pop)
            try:
                done, _ = await asyncio.wait({receive}, timeout=self._receivers.lend_after_s(index))
                if not done:
                    kept = min(asked, self._receivers.keeps_when_lent())
                    self._slots.lend(reservation, keep=kept)
                    self._receivers.lent(index, asked - kept)
                    lent = True
                messages = await receive
            except Exception as exc:
                self._slots.settle(reservation, 0)
                self._receivers.failed(index, asked=asked, lent=lent)
                if isinstance(exc, ConfigError):
                    self.fatal = exc
                    stop.set()
                    return
                if not isinstance(exc, QueueUnavailable):  # a receive loop must never die silently
                    log.exception("unexpected error while receiving; backing off")
                self._sqs.down(exc)
                failures += 1
                await _wait_for(stop, receive_backoff_s(failures=failures, rng=self._rng))
                continue
            except asyncio.CancelledError:
                receive.cancel()
                self._slots.settle(reservation, 0)
                self._receivers.failed(index, asked=asked, lent=lent)
                raise
            failures = 0
            self._sqs.up()
            self._receivers.answered(
                index, asked=asked, received=len(messages), lent=lent, elapsed_s=self.clock.monotonic() - began
            )
            # What its reservation still holds (a lent one or one borrowed from holds less), then free or borrowed
            # slots; the rest waits for a slot. The spare slots go back after the jobs were started, so these jobs
            # run before the receive loops those slots wake build their requests.
            placed, spare = self._slots.place(reservation, len(messages))
            placed += self._slots.take(len(messages) - placed)
            for message in messages[:placed]:
                self._accept(message, route)
            self._slots.release(spare)
            for message in messages[placed:]:
                self._spawn(self._place_later(message, route, stop))

    async def _place_later(self, message: Message, route: Route, stop: asyncio.Event) -> None:
        """A message a slow receive brought back after its slots went to another loop: it waits for a slot (ahead
        of new receives) for at most half its claim, and is released at once (visibility 0) if none comes first
        or the worker stops."""
        slot = asyncio.ensure_future(
            self._slots.acquire(self.options.visibility_timeout_s * EXTEND_BELOW_SHARE, rank=self.routes.index(route))
        )
        stopping = asyncio.ensure_future(stop.wait())
        cancelled = False
        try:
            await asyncio.wait({slot, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancelled = True
        stopping.cancel()
        slot.cancel()  # no-op when it is done; else Slots takes back a slot handed over in the same instant
        (got_slot,) = await asyncio.gather(slot, return_exceptions=True)
        if got_slot is True:
            if not (cancelled or self._stopping):
                self._accept(message, route)
                return
            self._slots.release(1)
        await self._release_unplaced(message, route)
        if cancelled:
            raise asyncio.CancelledError

    async def _release_unplaced(self, message: Message, route: Route) -> None:
        held = self._held(message, route)
        await asyncio.shield(
            self.outcomes.hold_back(held, self._release_delay_s(), "no free slot after a slow receive")
        )

    def _release_delay_s(self) -> int:
        """The visibility a message is put back with: 0, except while a receive abandoned at shutdown may still be
        open at SQS; then until it has ended, so the worker's own abandoned long poll cannot take the message for a
        whole visibility timeout (and count a receive)."""
        return max(0, math.ceil(self._abandoned_until - self.clock.monotonic()))

    def _held(self, message: Message, route: Route | None = None) -> Held:
        """A received message, with its attempt and receive counts (``worker.flow.attempts``)."""
        now = self.clock.monotonic()
        counts = counts_of(
            message_attributes=message.message_attributes,
            approximate_receive_count=message.receive_count,
            holds_here=self.outcomes.holds.count(message.message_id),
        )
        return Held(
            message,
            received_at=now,
            visible_until=now + self.options.visibility_timeout_s,
            attempt=counts.attempt,
            receive_count=counts.receive_count,
            route=route,
        )

    def _accept(self, message: Message, route: Route) -> None:
        held = self._held(message, route)
        self.heartbeat.track(held)
        self._emit(Kind.RECEIVED, held)
        group_id = message.group_id if route.queue.is_fifo else None
        if group_id is None:
            self._starts.offer(held)
            return
        group = (route.queue.name, group_id)
        waiting = self._groups.get(group)
        if waiting is not None:
            waiting.append(held)
            return
        self._groups[group] = deque([held])
        self._spawn(self._run_group(group))

    def _start(self, held: Held) -> None:
        """Run a held message (not of a FIFO group) now: its turn came (``Starts``)."""
        held.started = True
        self._spawn(self._run_one(held))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _run_one(self, held: Held) -> bool:
        if not held.lost and held.claim_running_out(
            self.clock.monotonic(), margin_s=min(START_MARGIN_S, self.options.visibility_timeout_s * 0.1)
        ):
            # Prefetched, or behind its FIFO group, while SQS could not be reached to extend its claim.
            held.lost = True
            self._emit(Kind.CLAIM_LOST, held, reason="its visibility timeout ran out while it waited to start")
        if held.lost:
            # Its claim lapsed while it waited to start (prefetched, or behind its FIFO group): SQS may have given
            # it to another worker already. Not run here; it reappears (or runs there). False: a FIFO group's
            # later messages must not overtake it.
            log.warning("claim lost before the job started; not run here", extra=held.log_fields(self.queue.name))
            self._forget(held)
            return False
        try:
            return await self._processor.process(held)
        except asyncio.CancelledError:
            if not held.finishing:  # cancelled before an outcome began (shutdown past the grace period)
                await self._finish(held, self._processor.abandon(held))
            raise
        except Exception:
            # A fault of the worker itself, not of the job: keep the message (it reappears later) and go on.
            log.exception("internal error while processing a message", extra=held.log_fields(self.queue.name))
            if not held.finishing:
                await self._finish(
                    held, self.outcomes.release(held, delay_s=INTERNAL_ERROR_RETRY_S, reason="internal error")
                )
            return False
        finally:
            self._forget(held)

    async def _finish(self, held: Held, outcome: Coroutine[Any, Any, None]) -> None:
        """Apply an outcome, shielded from cancellation. From this moment heartbeats stop for ``held`` and its
        slot is free: the next receive need not wait for this delete's round trip (shutdown still waits for it)."""
        held.finishing = True
        self._forget(held)
        applying = asyncio.ensure_future(outcome)
        self._applying.add(applying)
        applying.add_done_callback(self._applying.discard)
        await asyncio.shield(applying)

    async def _run_group(self, group: tuple[str, str]) -> None:
        """Run a FIFO group's messages in order; after a failure, release the rest of the group unprocessed."""
        waiting = self._groups[group]
        try:
            while waiting and not self._stopping:
                held = waiting.popleft()
                if not await self._start_in_group(held):
                    break
                # A task per message, as for any other job: a handler's context variables stay its own.
                if not await asyncio.create_task(self._run_one(held)):
                    # Visible again at once: SQS keeps the group locked while the failed message is in flight
                    # (its retry delay), so none of them can overtake it.
                    rest = list(waiting)
                    waiting.clear()
                    await self._release_all(rest, reason="earlier message of its group failed")
        finally:
            if self._groups.get(group) is waiting and not waiting:
                del self._groups[group]

    async def _start_in_group(self, held: Held) -> bool:
        """Wait for a start for a FIFO group's next message, in turn with other held messages; at shutdown it is
        released unrun (False)."""
        started = False
        try:
            started = await self._starts.wait()
        finally:  # closed, or cancelled while waiting
            if not started:
                await self._release_all([held], reason=SHUTDOWN, delay_s=self._release_delay_s())
        held.started = started
        return started

    def _forget(self, held: Held) -> None:
        """The job's outcome began (or it was released): its slot is free, and its start goes to the next message
        waiting for one (a prefetched message starts without waiting for a receive)."""
        if self.heartbeat.untrack(held):
            self._slots.release(1)
        if held.started:
            held.started = False
            self._starts.end()

    # ----------------------------------------------------------------------------------------------- releasing

    async def _release_all(self, batch: list[Held], *, reason: str, delay_s: int = 0) -> None:
        try:
            await asyncio.gather(*(self.outcomes.hold_back(held, delay_s, reason) for held in batch))
        finally:
            for held in batch:
                self._forget(held)

    # ----------------------------------------------------------------------------------------------- shutdown

    async def _shutdown(self, receivers: list[asyncio.Task[None]], heartbeat: asyncio.Task[None]) -> None:
        self._stopping = True
        if self._polls:  # abandoned below; SQS ends each at most poll_wait_s after it began (+1 s for the clocks)
            self._abandoned_until = max(self._polls.values()) + self.options.poll_wait_s + 1
        for task in receivers:
            task.cancel()
        await asyncio.gather(*receivers, return_exceptions=True)
        waiting = self._starts.close()  # prefetched, not started
        waiting += [held for group in self._groups.values() for held in group]
        for group in self._groups.values():
            group.clear()
        if waiting:
            await self._release_all(waiting, reason=SHUTDOWN, delay_s=self._release_delay_s())
        running = set(self._jobs)
        if running:
            log.info("waiting up to %.0f s for %d running job(s)", self.options.shutdown_grace_s, len(running))
            _, pending = await asyncio.wait(running, timeout=self.options.shutdown_grace_s)
            if pending:
                await self._cancel_jobs(pending)
        await self._finish_outcomes()
        await asyncio.gather(*(h.extension for h in self.heartbeat.tracked() if h.extension), return_exceptions=True)
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
        await asyncio.gather(*(queue.drain() for route in self.routes for queue in (route.queue, route.dlq)))
        # Threads still running handlers cannot be stopped: daemon threads, they end with the process.
        self._threads.close()
        log.info("worker stopped", extra={"queue": ", ".join(route.queue.name for route in self.routes)})

    async def _finish_outcomes(self) -> None:
        """Wait up to OUTCOME_FINISH_WAIT_S for the outcomes still being applied (a dead letter being sent when its
        job was cancelled past the grace); one still unfinished then is given up: its message reappears after its
        visibility timeout and runs again."""
        if not self._applying:
            return
        _, unfinished = await asyncio.wait(set(self._applying), timeout=OUTCOME_FINISH_WAIT_S)
        if unfinished:
            log.warning(
                "%d outcome(s) still being applied at exit (an endpoint failing?): their messages reappear after their "
                "visibility timeout and run again",
                len(unfinished),
            )
            for applying in unfinished:
                applying.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)

    async def _cancel_jobs(self, pending: set[asyncio.Task[Any]]) -> None:
        """Past the grace: cancel the jobs and release their messages. A plain ``def`` handler's thread cannot be
        stopped: its job waits up to THREAD_FINISH_WAIT_S more, acknowledged if it finishes, else left invisible."""
        threaded = sum(1 for held in self.heartbeat.tracked() if self._threads.is_running(held))
        self._threads.wait_on_cancel(THREAD_FINISH_WAIT_S)
        for task in pending:
            task.cancel()
        log.warning("cancelled %d job(s) still running after the grace period", len(pending))
        if threaded:
            log.warning(
                "%d plain def handler(s) still run in threads: their messages stay invisible; a handler that returns "
                "within %g s gets its outcome (success deletes), the others run again after their visibility timeout",
                threaded,
                THREAD_FINISH_WAIT_S,
            )
        await asyncio.gather(*pending, return_exceptions=True)

    # ----------------------------------------------------------------------------------------------- events

    def _emit(self, kind: Kind, held: Held, **fields: Any) -> None:
        self.outcomes.emit(kind, held, **fields)

    @property
    def in_flight(self) -> int:
        return len(self.heartbeat)

    @property
    def idle(self) -> bool:
        """Nothing held and no job task alive (running, waiting for a slot or applying an outcome)."""
        return not self._jobs and not len(self.heartbeat)


def receive_backoff_s(*, failures: int, rng: random.Random) -> float:
    """Pause after ``failures`` failed receives in a row: the RECEIVE budget (50-100% of 0.1 s doubling, at most
    20 s, never giving up)."""
    delay_s = retry_delay_s(budget=RECEIVE, failures=failures, elapsed_s=0.0, jitter=rng.random())
    assert delay_s is not None  # the RECEIVE budget never gives up
    return delay_s


async def _wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``event``; returns early when it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=timeout_s)
