"""Receive loops: the slot accounting they share, their backoff after a failed receive, and how many there are."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from worker.backends.batching import EntryFailed
from worker.backends.sqs import Message, Queue
from worker.budgets import RECEIVE
from worker.flow.priorities import Mode
from worker.jobs import Registry
from worker.runtime.queueset import Receivers, Route
from worker.runtime.slots import Slots, receive_loops
from worker.runtime.worker import RuntimeOptions, Worker, receive_backoff_s


@pytest.mark.parametrize(("concurrency", "loops"), [(1, 4), (10, 4), (11, 5), (20, 5), (1000, 103)])
def test_one_receive_loop_per_ten_slots_plus_spares(concurrency: int, loops: int) -> None:
    assert receive_loops(concurrency) == loops


def test_the_first_backoff_is_short_and_grows_only_on_repeated_failure() -> None:
    rng = random.Random(1)
    first = [receive_backoff_s(failures=1, rng=rng) for _ in range(200)]
    assert min(first) >= 0.05 and max(first) <= 0.1
    assert len({round(s, 4) for s in first}) > 100, "jittered"
    assert all(0.4 <= receive_backoff_s(failures=4, rng=rng) <= 0.8 for _ in range(50))
    assert all(RECEIVE.max_delay_s / 2 <= receive_backoff_s(failures=n, rng=rng) <= 20 for n in (9, 50, 10**6))


async def test_a_waiting_message_gets_the_next_slot_before_a_new_receive() -> None:
    slots = Slots(2)
    first = await slots.reserve(10)
    assert first.count == 2
    slots.lend(first)  # a slow receive: its slots free for others, and both taken again
    assert slots.take(2) == 2
    waiting = asyncio.create_task(slots.acquire(timeout_s=5))
    receiving = asyncio.create_task(slots.reserve(10))
    await asyncio.sleep(0)
    slots.release(1)
    assert await waiting is True
    await asyncio.sleep(0)
    assert not receiving.done(), "no new receive while the slot went to the waiting message"
    slots.release(1)
    assert (await asyncio.wait_for(receiving, timeout=1)).count == 1


async def test_a_message_gives_up_waiting_for_a_slot_after_its_timeout() -> None:
    slots = Slots(1)
    assert slots.take(1) == 1  # the slot is running a job
    assert await slots.acquire(timeout_s=0.01) is False
    slots.release(1)
    assert slots.free == 1
    assert (await asyncio.wait_for(slots.reserve(5), timeout=1)).count == 1


async def test_a_cancelled_wait_leaves_no_slot_behind() -> None:
    slots = Slots(1)
    assert slots.take(1) == 1
    waiting = asyncio.create_task(slots.acquire(timeout_s=5))
    await asyncio.sleep(0)
    slots.release(1)  # handed to the waiter...
    waiting.cancel()  # ...which is cancelled before it runs: the slot must come back
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert slots.free == 1


def test_take_never_waits_and_never_overdraws() -> None:
    slots = Slots(3)
    assert slots.take(2) == 2
    assert slots.take(5) == 1
    assert slots.take(1) == 0
    assert slots.free == 0


async def test_a_message_without_a_slot_borrows_from_a_long_poll_in_flight() -> None:
    """The idle-worker case: a lent receive brings a message while another loop's long poll holds every free
    slot; the message borrows one at once instead of waiting until that poll returns (up to 20 s)."""
    slots = Slots(10)
    slow = await slots.reserve(10)
    slots.lend(slow)  # the slow receive gave its slots back...
    poll = await slots.reserve(10)  # ...and another loop's long poll holds them all
    assert (poll.count, slots.free) == (10, 0)
    assert slots.settle(slow, 1) == 0  # the slow receive brings one message: its reservation holds nothing
    assert slots.take(1) == 1  # borrowed from the poll in flight
    assert poll.count == 9
    assert slots.settle(poll, 0) == 0  # the poll returns empty: it gives back what it still holds
    assert (slots.free, slots.in_use) == (9, 1)


async def test_a_receive_places_no_more_than_its_reservation_still_holds() -> None:
    slots = Slots(3)
    poll = await slots.reserve(3)
    assert slots.take(2) == 2  # two messages of a slow receive borrowed from it
    assert slots.settle(poll, 3) == 1  # it brings three: one has a slot, two wait for one
    assert (slots.free, slots.take(2)) == (0, 0)
    slots.release(1)
    assert await slots.acquire(timeout_s=0.01) is True


async def test_a_waiting_message_borrows_before_it_waits() -> None:
    slots = Slots(2)
    poll = await slots.reserve(10)
    assert await asyncio.wait_for(slots.acquire(timeout_s=5), timeout=1) is True
    assert poll.count == 1


class ScriptedQueue(Queue):
    """A queue whose receives a test scripts (``receive``); deletes are recorded, visibility changes accepted."""

    def __init__(self, name: str) -> None:
        super().__init__(cast(Any, None), f"http://127.0.0.1:1/000000000000/{name}")
        self.deleted: list[str] = []
        self.calls = 0

    @staticmethod
    def mark(n: int) -> list[Message]:
        body = json.dumps({"type": "mark", "payload": {"n": n}})
        return [Message(f"id-{n}", f"handle-{n}", body, {"ApproximateReceiveCount": "1"}, {})]

    async def _delete_batch(self, handles: list[str]) -> dict[int, EntryFailed]:
        self.deleted.extend(handles)
        return {}

    async def _visibility_batch(self, items: list[tuple[str, int]]) -> dict[int, EntryFailed]:
        return {}

    async def maximum_message_bytes(self) -> int | None:
        return None  # not readable: the worker's start check then says nothing


class StalledSecondReceive(ScriptedQueue):
    """The second receive never answers (a stalled connection); every other one brings one message."""

    def __init__(self) -> None:
        super().__init__("stalled")
        self.stalled = asyncio.Event()

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.calls += 1
        if self.calls == 2:
            self.stalled.set()
            await asyncio.Event().wait()  # never answers; cancelled at shutdown
        return self.mark(self.calls)


class SlowAnswerThenIdle(ScriptedQueue):
    """Receive 1 brings a job (the queue looks busy); receive 2 is slow and brings its message only when the test
    says; receive 3 answers empty (the queue went idle); every later receive is a long poll that never answers."""

    def __init__(self) -> None:
        super().__init__("idle")
        self.second_may_answer = asyncio.Event()
        self.long_poll_holds_the_slot = asyncio.Event()

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.calls += 1
        call = self.calls
        if call == 2:
            await self.second_may_answer.wait()
        elif call == 3:
            return []
        elif call > 3:
            self.long_poll_holds_the_slot.set()
            await asyncio.Event().wait()  # an idle long poll; cancelled at shutdown
        return self.mark(call)


@contextlib.asynccontextmanager
async def one_slot_worker(queue: ScriptedQueue, ran: list[int], nth: int) -> AsyncIterator[asyncio.Event]:
    """A worker with one slot on ``queue`` whose ``mark`` jobs append their n to ``ran``; yields an event set
    when ``nth`` jobs ran; stops the worker on the way out."""
    registry = Registry()
    enough = asyncio.Event()

    @registry.job("mark")
    async def mark(payload: dict[str, int]) -> None:
        ran.append(payload["n"])
        if len(ran) == nth:
            enough.set()

    worker = Worker(
        registry=registry,
        queue=queue,
        dlq=ScriptedQueue("dlq"),
        options=RuntimeOptions(concurrency=1, visibility_timeout_s=30, shutdown_grace_s=5, poll_wait_s=20),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield enough
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


async def test_a_stalled_receive_does_not_idle_the_slots() -> None:
    """Concurrency 1: the one slot's receive stalls; another loop takes the slot and the next job runs."""
    queue = StalledSecondReceive()
    ran: list[int] = []
    async with one_slot_worker(queue, ran, nth=2) as two_ran:
        await asyncio.wait_for(two_ran.wait(), timeout=5)
        assert queue.stalled.is_set()
    assert ran[:2] == [1, 3]
    assert queue.deleted[:2] == ["handle-1", "handle-3"]


async def test_a_late_answer_on_an_idle_worker_runs_at_once() -> None:
    """A message a slow (lent) receive brings while another loop's idle long poll holds the free slot runs at
    once, borrowing that slot; it used to wait half a visibility timeout and then be released unrun."""
    queue = SlowAnswerThenIdle()
    ran: list[int] = []
    async with one_slot_worker(queue, ran, nth=2) as second_ran:
        await asyncio.wait_for(queue.long_poll_holds_the_slot.wait(), timeout=5)
        queue.second_may_answer.set()
        await asyncio.wait_for(second_ran.wait(), timeout=3)  # before the fix: 15 s, then released unrun
    assert ran == [1, 2]


def single_queue_receivers(slots: Slots, *, fill_wait_s: float) -> Receivers:
    """The receive side of a worker on one queue (``Receivers.reserve`` only picks the route: it sends nothing)."""
    queue = Queue(cast(Any, None), "http://127.0.0.1:1/000000000000/jobs")
    dlq = Queue(cast(Any, None), "http://127.0.0.1:1/000000000000/jobs-dlq")
    return Receivers([Route(queue, dlq)], mode=Mode.WEIGHTED, slots=slots, hedge_after_s=0.05, fill_wait_s=fill_wait_s)


async def answer(receivers: Receivers, *, received: int) -> None:
    """One receive as the runtime makes it: reserve, then the queue's answer of ``received`` messages (a full
    answer makes the queue busy, an empty one idle); the messages keep their slots."""
    _, index, reservation = await asyncio.wait_for(receivers.reserve(), timeout=1)
    asked = reservation.count
    receivers.slots.settle(reservation, received)
    receivers.answered(index, asked=asked, received=received, lent=False, elapsed_s=0.01)


async def test_a_busy_receive_waits_briefly_for_a_full_batch_of_slots() -> None:
    slots = Slots(20)
    receivers = single_queue_receivers(slots, fill_wait_s=5)
    await answer(receivers, received=10)  # a busy queue: 10 jobs hold 10 slots
    assert slots.take(8) == 8  # 2 free: without a fill wait, a receive would ask for 2 messages
    receiving = asyncio.create_task(receivers.reserve())
    await asyncio.sleep(0)
    assert not receiving.done()
    slots.release(7)
    await asyncio.sleep(0)
    assert not receiving.done(), "9 free: still short of a batch"
    slots.release(1)
    _, _, reservation = await asyncio.wait_for(receiving, timeout=1)
    assert reservation.count == 10
    assert slots.free == 0


async def test_the_fill_wait_ends_with_what_is_free_at_its_deadline() -> None:
    slots = Slots(20)
    receivers = single_queue_receivers(slots, fill_wait_s=0.01)
    await answer(receivers, received=10)
    assert slots.take(7) == 7
    _, _, reservation = await asyncio.wait_for(receivers.reserve(), timeout=1)
    assert reservation.count == 3  # long jobs: the receive goes ahead with the slots it has


async def test_an_idle_queue_receives_with_the_slots_free_at_once() -> None:
    slots = Slots(20)
    receivers = single_queue_receivers(slots, fill_wait_s=5)
    await answer(receivers, received=0)  # the last receive found the queue empty: no batch to wait for
    assert slots.take(18) == 18
    _, _, reservation = await asyncio.wait_for(receivers.reserve(), timeout=1)
    assert reservation.count == 2


async def test_two_receives_filling_are_woken_one_batch_at_a_time() -> None:
    slots = Slots(30)
    receivers = single_queue_receivers(slots, fill_wait_s=5)
    await answer(receivers, received=10)
    assert slots.take(18) == 18  # 2 free: both receives wait to fill a batch
    first = asyncio.create_task(receivers.reserve())
    second = asyncio.create_task(receivers.reserve())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not first.done() and not second.done()
    slots.release(10)  # 12 free: one batch; one receive goes, the other keeps waiting for its own
    for _ in range(5):
        await asyncio.sleep(0)
    assert [first.done(), second.done()] == [True, False]
    assert first.result()[2].count == 10
    slots.release(3)  # 5 free: woken by the first batch too, it would have gone with the 2 left
    for _ in range(5):
        await asyncio.sleep(0)
    assert not second.done()
    slots.release(5)
    _, _, reservation = await asyncio.wait_for(second, timeout=1)
    assert reservation.count == 10


async def test_leftover_slots_wait_longer_for_a_batch_while_another_receive_is_in_flight() -> None:
    slots = Slots(14)
    queue = Queue(cast(Any, None), "http://127.0.0.1:1/000000000000/jobs")
    dlq = Queue(cast(Any, None), "http://127.0.0.1:1/000000000000/jobs-dlq")
    receivers = Receivers(
        [Route(queue, dlq)],
        mode=Mode.WEIGHTED,
        slots=slots,
        hedge_after_s=0.05,
        fill_wait_s=0.001,
        fill_wait_in_flight_s=5,
    )
    await answer(receivers, received=10)  # busy; those 10 jobs finish at once
    slots.release(10)
    _, _, in_flight = await asyncio.wait_for(receivers.reserve(), timeout=1)  # a receive of 10 is in flight
    assert in_flight.count == 10
    leftover = asyncio.create_task(receivers.reserve())  # 4 free: it waits for a batch, past fill_wait_s
    await asyncio.sleep(0.05)
    assert not leftover.done()
    placed, spare = slots.place(in_flight, 10)  # the receive in flight brings 10; their jobs finish
    assert (placed, spare) == (10, 0)
    slots.release(10)
    _, _, reservation = await asyncio.wait_for(leftover, timeout=1)
    assert reservation.count == 10


async def test_receives_queued_behind_the_first_filler_wait_their_own_turn() -> None:
    """Three receives wait to fill a batch while only 3 slots are free: the first gives up after its wait, the
    second's wait starts only then, and so on (each with its own timer from its start, a busy worker's queued
    receives gave up together and each asked for the one or two slots freed meanwhile)."""
    slots = Slots(30)
    slots.reserve_now(30)
    loop = asyncio.get_running_loop()
    done_at: dict[int, float] = {}

    async def filling(index: int) -> None:
        await slots.fill(10, 0.05)
        done_at[index] = loop.time()

    tasks = [asyncio.create_task(filling(index)) for index in range(3)]
    await asyncio.sleep(0)
    started = loop.time()
    slots.release(3)  # fewer than a batch: nobody is woken, each waits out its turn
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=2)
    assert done_at[0] - started >= 0.045
    assert done_at[1] - done_at[0] >= 0.045
    assert done_at[2] - done_at[1] >= 0.045
