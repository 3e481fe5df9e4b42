"""Handler slots: how many more messages this worker may hold. Receive loops reserve slots before they
ask SQS for messages, so a worker never takes more than it can start at once; messages that arrived without a
slot (a slow receive whose slots went to another loop) take a free one, else borrow one from a receive still in
flight (a long poll on an idle queue rarely fills its reservation), else wait for one ahead of any new receive."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque


class Reservation:
    """The slots one receive holds while it is in flight; a message that arrived without a slot may borrow from
    it (``count`` goes down), so the receive then places fewer of what it brings."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count

    def __repr__(self) -> str:
        return f"Reservation({self.count})"


class Slots:
    """A counter of free handler slots that receive loops can reserve in bulk (at most 10 at a time)."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("total must be >= 1")
        self.total = total
        self.free = total
        self._available = asyncio.Event()
        self._available.set()
        #: Receives waiting to fill their batch (``fill``): how many slots each wants, woken when that many are free.
        self._fillers: list[tuple[int, asyncio.Future[None], float]] = []
        #: The first of them still waiting, and its timer (``fill``).
        self._timed: asyncio.Future[None] | None = None
        self._filler_timer: asyncio.TimerHandle | None = None
        self._waiters: deque[asyncio.Future[bool]] = deque()
        #: Each waiter's rank (its queue's place in a queue set): a lower rank is served first, FIFO within one.
        self._ranks: dict[asyncio.Future[bool], int] = {}
        #: Reservations of receives in flight (not lent): what a message without a slot may borrow from.
        self._open: list[Reservation] = []

    async def reserve(self, most: int) -> Reservation:
        """Wait until at least one slot is free and no message waits for one, then take up to ``most`` for a
        receive; ``settle`` it when the receive returns, or ``lend`` it when the receive is slow. (The runtime
        reserves through ``Receivers.reserve``, which waits for a full batch on a busy queue: ``fill``.)"""
        await self.wait_free()
        return self.reserve_now(most)

    async def wait_free(self) -> None:
        """Wait until at least one slot is free and no message waits for one (``reserve_now`` may then take)."""
        while self.free == 0 or self._waiters:
            self._available.clear()
            await self._available.wait()

    def reserve_now(self, most: int) -> Reservation:
        """Take up to ``most`` free slots (at least one must be free) for a receive, without waiting."""
        taken = min(most, self.free)
        self.free -= taken
        reservation = Reservation(taken)
        self._open.append(reservation)
        return reservation

    async def fill(self, wanted: int, wait_s: float) -> None:
        """Until ``wanted`` slots are free (and no message waits for one), for at most ``wait_s``; then until at
        least one is. A receive on a busy queue asks for a full batch instead of the one or two slots just freed:
        fewer ReceiveMessage calls per job, and fuller DeleteMessageBatch calls after them."""
        if (self.free < wanted or self._waiters or self._fillers) and wait_s > 0:
            # Woken by ``release`` once ``wanted`` slots are free for it (not on every release: with several
            # receives filling, each release would wake them all), in turn behind the receives filling before it,
            # or by the timer. Only the first of them still waiting has a timer, started when it became the first:
            # with a timer each, the receives queued behind it (a busy worker has many) would each give up and take
            # the one or two slots freed meanwhile.
            filler: tuple[int, asyncio.Future[None], float] = (
                wanted,
                asyncio.get_running_loop().create_future(),
                wait_s,
            )
            self._fillers.append(filler)
            self._wake_fillers()
            self._time_first_filler()
            try:
                await filler[1]
            finally:
                with contextlib.suppress(ValueError):
                    self._fillers.remove(filler)
                if self._timed is filler[1]:  # cancelled while timed: the next one's turn
                    self._time_next_filler()
        while self.free == 0 or self._waiters:  # the wait may have ended with nothing left for this receive
            self._available.clear()
            await self._available.wait()

    def _time_first_filler(self) -> None:
        """Start the timer of the first receive still waiting to fill, unless one runs."""
        if self._timed is not None:
            return
        for _, future, wait_s in self._fillers:
            if not future.done():
                self._timed = future
                self._filler_timer = asyncio.get_running_loop().call_later(wait_s, self._filler_due)
                return

    def _filler_due(self) -> None:
        timed, self._timed, self._filler_timer = self._timed, None, None
        if timed is not None:
            _resolve(timed)
        self._time_first_filler()

    def _time_next_filler(self) -> None:
        """The timed receive is no longer waiting: stop its timer and start the next one's."""
        if self._filler_timer is not None:
            self._filler_timer.cancel()
        self._timed, self._filler_timer = None, None
        self._time_first_filler()

    def settle(self, reservation: Reservation, received: int) -> int:
        """The receive of ``reservation`` returned ``received`` messages: keep a slot for as many as it still
        holds, give back the rest. Returns how many of the messages have a slot (0 for a lent reservation)."""
        placed, spare = self.place(reservation, received)
        self.release(spare)
        return placed

    def place(self, reservation: Reservation, received: int) -> tuple[int, int]:
        """``settle`` without giving back: how many of the messages have a slot, and the spare slots the caller
        must ``release``."""
        if reservation in self._open:
            self._open.remove(reservation)
        placed = min(received, reservation.count)
        spare, reservation.count = reservation.count - placed, 0
        return placed, spare

    def lend(self, reservation: Reservation, *, keep: int = 0) -> None:
        """A slow receive gives its slots back for other loops, but ``keep`` (no other message may borrow those);
        what it brings later beyond them ``take``s slots."""
        if keep <= 0:
            self.settle(reservation, 0)
            return
        if reservation in self._open:
            self._open.remove(reservation)
        kept = min(keep, reservation.count)
        spare, reservation.count = reservation.count - kept, kept
        self.release(spare)

    def take(self, most: int) -> int:
        """Take up to ``most`` slots without waiting (possibly none): free ones, then borrowed from receives in
        flight."""
        taken = min(most, self.free)
        self.free -= taken
        return taken + self._borrow(most - taken)

    def _borrow(self, most: int) -> int:
        borrowed = 0
        for reservation in sorted(self._open, key=lambda r: -r.count):
            if borrowed == most:
                break
            share = min(most - borrowed, reservation.count)
            reservation.count -= share
            borrowed += share
        return borrowed

    async def acquire(self, timeout_s: float, *, rank: int = 0) -> bool:
        """Wait up to ``timeout_s`` for one slot, ahead of ``reserve`` and of the waiters of a higher ``rank``
        (a lower-priority queue). True when it was taken."""
        if all(self._ranks[other] > rank for other in self._waiters) and self.take(1) == 1:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        behind = sum(1 for other in self._waiters if self._ranks[other] <= rank)
        self._waiters.insert(behind, waiter)
        self._ranks[waiter] = rank
        timer = loop.call_later(timeout_s, self._expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                if waiter.result():  # handed a slot in the same instant: give it back
                    self.release(1)
            else:
                self._drop(waiter)
            raise
        finally:
            timer.cancel()

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            self._drop(waiter)
            waiter.set_result(False)

    def _drop(self, waiter: asyncio.Future[bool]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            del self._ranks[waiter]
        self._wake()

    def release(self, count: int = 1) -> None:
        if count <= 0:
            return
        self.free = min(self.total, self.free + count)
        while self.free > 0 and self._waiters:
            self.free -= 1
            waiter = self._waiters.popleft()
            del self._ranks[waiter]
            waiter.set_result(True)
        self._wake_fillers()
        self._wake()

    def _wake_fillers(self) -> None:
        """Wake the receives filling their batch, oldest first, as far as the free slots go (each its ``wanted``)."""
        if not self._fillers or self._waiters:
            return
        budget = self.free
        for wanted, future, _ in self._fillers:  # one woken before but not yet run counts too: it takes its share
            if wanted > budget:
                break
            budget -= wanted
            if not future.done():
                future.set_result(None)
        if self._timed is not None and self._timed.done():  # the timed one was woken: time the next
            self._time_next_filler()

    def _wake(self) -> None:
        if self.free > 0 and not self._waiters:
            self._available.set()

    @property
    def receiving(self) -> bool:
        """Whether a receive holding slots (not lent) is in flight."""
        return bool(self._open)

    @property
    def in_use(self) -> int:
        return self.total - self.free


#: Receive loops beyond one per 10 slots, to use the slots a slow receive gave back (``worker.runtime.worker``).
SPARE_RECEIVE_LOOPS = 3


def receive_loops(concurrency: int) -> int:
    """Receive loops for ``concurrency`` slots: one per 10 slots (a receive takes at most 10), plus spares."""
    return math.ceil(concurrency / 10) + SPARE_RECEIVE_LOOPS


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
