"""The queues one worker consumes (``Route``: a queue, its own DLQ, its weight) and the receive side of the
priority policy: receive loops ask ``Receivers.reserve`` for their next receive, which waits until a slot is free
and ``worker.flow.priorities`` names a queue that needs one, then reserves the slots for it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from worker.backends.protocols import MessageQueue
from worker.flow.priorities import AnswerTimes, Mode, Priorities
from worker.runtime.slots import Reservation, Slots


@dataclass(frozen=True, eq=False)
class Route:
    """Where a message came from and where its dead letters go: its queue and that queue's DLQ."""

    queue: MessageQueue
    dlq: MessageQueue
    weight: int = 1


class Receivers:
    """Hands out receives over a set of routes, by the priority policy, from the worker's slots."""

    def __init__(
        self,
        routes: Sequence[Route],
        *,
        mode: Mode,
        slots: Slots,
        hedge_after_s: float,
        fill_wait_s: float = 0.0,
        fill_wait_in_flight_s: float | None = None,
    ) -> None:
        self.routes = list(routes)
        #: A single busy queue: how long a receive waits for a full batch of free slots (``Slots.fill``), and how
        #: long while another receive is in flight: its messages run and free their slots soon, so the few slots
        #: left over (64 slots are 6 batches and 4) wait for them instead of asking SQS for a partial batch.
        self.fill_wait_s = fill_wait_s
        self.fill_wait_in_flight_s = fill_wait_s if fill_wait_in_flight_s is None else fill_wait_in_flight_s
        self._busy = False
        self.policy = Priorities([route.weight for route in self.routes], mode=mode)
        self.answer_times = AnswerTimes(floor_s=hedge_after_s)
        self.slots = slots
        self._changed = asyncio.Event()

    async def reserve(self) -> tuple[Route, int, Reservation]:
        """Wait for a slot and a queue that needs a receive; the route, its index and the slots reserved."""
        while True:
            await self.slots.wait_free()
            if self.policy.single and self._busy and self.fill_wait_s > 0:
                wait_s = self.fill_wait_in_flight_s if self.slots.receiving else self.fill_wait_s
                await self.slots.fill(min(10, self.slots.total), wait_s)
            grant = self.policy.next(self.slots.free)
            if grant is not None:
                return self.routes[grant.index], grant.index, self.slots.reserve_now(grant.count)
            self._changed.clear()
            await self._changed.wait()

    def lend_after_s(self, index: int) -> float | None:
        """When a receive on the queue at ``index`` still unanswered gives its slots back (None: it keeps them):
        after 5x the endpoint's usual answer time, at least ``hedge_after_s`` (``AnswerTimes``). A single queue
        only while busy: a stalled endpoint. A set: a long poll on an empty queue. (A fixed 50 ms lent the slots of
        every slow answer of a loaded endpoint, 10 ms away: an extra receive each, and the late messages then took
        the slots that the receives filling a batch waited for.)"""
        if not self.policy.hedges(index):
            return None
        return self.answer_times.empty_after_s()

    def keeps_when_lent(self) -> int:
        """Slots a receive of a set keeps when it lends the rest (a long poll on an idle queue): one, so that queue's
        next job starts at once even while the other queues keep every other slot busy; none on a single queue,
        or with fewer than two slots per queue (the others need them to make progress)."""
        return 0 if self.policy.single or self.slots.total < 2 * len(self.routes) else 1

    def lent(self, index: int, count: int) -> None:
        self.policy.lent(index, count)
        self._changed.set()

    def answered(self, index: int, *, asked: int, received: int, lent: bool, elapsed_s: float) -> None:
        self._busy = received > 0
        if received and not lent:
            self.answer_times.observe(elapsed_s)
        self.policy.answered(index, asked=asked, received=received, lent=lent)
        self._changed.set()

    def failed(self, index: int, *, asked: int, lent: bool) -> None:
        self.policy.failed(index, asked=asked, lent=lent)
        self._changed.set()
