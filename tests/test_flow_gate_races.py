"""Races of the flow gate with its store: answers that come back late, out of order, lost after landing, or after
a reset; concurrent failures and probes of one key in one worker and across two. Each test but the last two (which
held before) failed before its fix (review 24)."""

from __future__ import annotations

import asyncio
import random
import time
import types
from typing import Any

import pytest

from worker.errors import LedgerUnavailable
from worker.flow import breaker as policy
from worker.flow import gate as gate_module
from worker.flow import gcra
from worker.flow.breaker import Breaker, State
from worker.flow.gate import Gate, Outcome, Step
from worker.flow.store import MemoryFlowStore, SlotAnswer

NOW_MS = 1_000_000_000
KEY = "host"


class Clock:
    """The gate's monotonic clock (its breaker cache) under the test's hand."""

    def __init__(self) -> None:
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(gate_module, "time", types.SimpleNamespace(monotonic=lambda: clock.mono, time=time.time))
    return clock


class Wrapped:
    """A MemoryFlowStore, each call passing through an overridable hook."""

    shared = True

    def __init__(self, store: MemoryFlowStore) -> None:
        self.store = store

    async def take_slot(self, key: str, plan: gcra.Plan) -> SlotAnswer:
        return await self.store.take_slot(key, plan)

    async def breaker(self, key: str) -> policy.Record | None:
        return await self.store.breaker(key)

    async def write_breaker(
        self, key: str, record: policy.Record, *, seen_version: int | None
    ) -> tuple[bool, policy.Record | None]:
        return await self.store.write_breaker(key, record, seen_version=seen_version)


async def admit(gate: Gate, breaker: Breaker, n: int | str, timeout_s: float = 900) -> Any:
    return await gate.admit(
        job_type="hook",
        rate=None,
        rate_key=None,
        breaker=breaker,
        breaker_key=KEY,
        message_id=str(n),
        timeout_s=timeout_s,
    )


# ------------------------------------------------------------------------------------------------------------ 1


async def test_a_read_sent_after_the_opening_write_but_answered_first_does_not_reclose_the_breaker(
    clock: Clock,
) -> None:
    """The worker's counted failure opens the breaker (its write is in flight); a job of the key arrives, the
    cache being older than BREAKER_CACHE_S, and reads: the read is sent after the write (a higher call number) but
    served before the write lands (the old, closed record). The write's answer (open) then loses to the read's
    number, and the worker that has just opened the breaker runs the key's jobs for another BREAKER_CACHE_S."""
    store = MemoryFlowStore()
    land = asyncio.Event()
    sent = asyncio.Event()

    class SlowOpeningWrite(Wrapped):
        async def write_breaker(self, key: str, record: policy.Record, *, seen_version: int | None) -> Any:
            if record.state is State.OPEN:  # the opening write: in flight until the test lets it land
                sent.set()
                await land.wait()
            return await self.store.write_breaker(key, record, seen_version=seen_version)

    changes: list[str] = []
    gate = Gate(SlowOpeningWrite(store), owner="a", now_ms=lambda: NOW_MS)
    gate.on_change = lambda change: changes.append(change.state.value)
    breaker = Breaker(key=lambda p: KEY, failures=2, window_s=60, cooldown_s=30)

    tickets = [(await admit(gate, breaker, n)).ticket for n in range(2)]
    await gate.report(tickets[0], Outcome.COUNTED, job_type="hook")  # failures 1 (version 1)
    clock.advance(2.0)  # the jobs ran a while: this worker's breaker read is older than BREAKER_CACHE_S
    opening = asyncio.ensure_future(gate.report(tickets[1], Outcome.COUNTED, job_type="hook"))
    await sent.wait()  # the opening write is on its way
    crossing = await admit(gate, breaker, 2)  # reads: served before the write lands (closed, failures 1)
    assert crossing.step is Step.RUN  # fair: the breaker was not open yet when it was read
    land.set()
    await opening
    assert changes == ["open"]  # this worker opened it...
    assert store._breakers[KEY].state is State.OPEN
    after = await admit(gate, breaker, 3)  # ...and its next job must be held
    assert after.step is Step.HOLD, f"worker opened the breaker, yet runs its next job: {after}"


# ------------------------------------------------------------------------------------------------------------ 2


class RetriedAfterLanding(Wrapped):
    """What DynamoFlowStore does when an UpdateItem lands but its answer is lost (ReadTimeoutError, a 500 after
    the write): call_with_budget sends the same conditional write again; it is refused (the version moved, by
    the first send) and answers ALL_OLD: the record the first send wrote. ``times``: how many writes so."""

    def __init__(self, store: MemoryFlowStore, times: int = 1) -> None:
        super().__init__(store)
        self.times = times

    async def write_breaker(self, key: str, record: policy.Record, *, seen_version: int | None) -> Any:
        if self.times > 0:
            self.times -= 1
            await self.store.write_breaker(key, record, seen_version=seen_version)  # landed; answer lost
        return await self.store.write_breaker(key, record, seen_version=seen_version)  # the retry's answer


async def test_a_read_sent_before_the_opening_write_but_answered_after_it_does_not_reclose_the_breaker(
    clock: Clock,
) -> None:
    """The other order: a job's read (the cache being older than BREAKER_CACHE_S) is on the wire with the old,
    closed record when a counted failure's write opens the breaker and is answered; the read's answer comes
    last. Remembering it put the breaker back to closed in the worker that had just opened it (seen across two
    workers on a loaded machine: 11 calls where 3 ran before the breaker opened)."""
    store = MemoryFlowStore()
    read_sent, read_may_answer = asyncio.Event(), asyncio.Event()

    class SlowRead(Wrapped):
        slow = False

        async def breaker(self, key: str) -> policy.Record | None:
            record = await self.store.breaker(key)  # served now: the old record
            if self.slow:
                read_sent.set()
                await read_may_answer.wait()
            return record

    slow = SlowRead(store)
    changes: list[str] = []
    gate = Gate(slow, owner="a", now_ms=lambda: NOW_MS)
    gate.on_change = lambda change: changes.append(change.state.value)
    breaker = Breaker(key=lambda p: KEY, failures=2, window_s=60, cooldown_s=30)

    tickets = [(await admit(gate, breaker, n)).ticket for n in range(2)]
    await gate.report(tickets[0], Outcome.COUNTED, job_type="hook")  # failures 1
    clock.advance(2.0)
    slow.slow = True
    crossing = asyncio.ensure_future(admit(gate, breaker, 2))  # reads: closed, answer held back
    await read_sent.wait()
    slow.slow = False
    await gate.report(tickets[1], Outcome.COUNTED, job_type="hook")  # opens, answered at once
    assert changes == ["open"]
    read_may_answer.set()
    assert (await crossing).step is Step.HOLD  # its answer is older than what the worker knows by then
    decision = await admit(gate, breaker, 3)
    assert decision.step is Step.HOLD, f"the worker that opened the breaker runs its next job: {decision}"


# ------------------------------------------------------------------------------------------------------------ 3


async def test_a_probe_write_that_raises_after_landing_does_not_leave_a_ghost_probe(clock: Clock) -> None:
    """The probe's write lands, then the call fails (its retries' budget spent: LedgerUnavailable). The runtime
    holds the message back (LEDGER_RETRY_S, 'flow table unreachable'); the breaker names it as its running
    probe for timeout_s + 5 s, and every job of the key, on every worker, is held back meanwhile."""
    store = MemoryFlowStore()
    store._breakers[KEY] = policy.Record(state=State.OPEN, open_until_ms=NOW_MS - 1, version=3)
    fail = [True]

    class LandsThenRaises(Wrapped):
        async def write_breaker(self, key: str, record: policy.Record, *, seen_version: int | None) -> Any:
            answer = await self.store.write_breaker(key, record, seen_version=seen_version)
            if fail[0]:
                fail[0] = False
                raise LedgerUnavailable("DynamoDB UpdateItem: read timeout (test)")
            return answer

    gate = Gate(LandsThenRaises(store), owner="a", now_ms=lambda: NOW_MS)
    other = Gate(store, owner="b", now_ms=lambda: NOW_MS)
    breaker = Breaker(key=lambda p: KEY, failures=2, window_s=60, cooldown_s=30)
    with pytest.raises(LedgerUnavailable):
        await admit(gate, breaker, "probe")  # the runtime: hold_back(LEDGER_RETRY_S); no ticket, no report
    # the endpoint is back a moment later: the next job of the key, on another worker
    decision = await admit(other, breaker, "next")
    assert decision.step is Step.RUN, (
        f"no job runs, yet the key is half-open with a probe 'running' for "
        f"{(store._breakers[KEY].probe_until_ms - NOW_MS) / 1000:g} s: {decision}"
    )


# ------------------------------------------------------------------------------------------------------------ 4


async def test_a_reset_is_not_undone_by_a_worker_whose_cached_version_the_new_item_reached_again(
    clock: Clock,
) -> None:
    """``breakers reset`` deletes the item; versions started again at 1 (now: at random). Worker B holds a cached
    record (its probe, half-open, version 3). After the reset worker A counts 3 failures (versions 1..3, closed,
    3 of 10). B's probe
    then fails: its write, conditioned on version 3 of the OLD item, passes on the NEW item, and opens the
    breaker from the pre-reset state: A's three failures and the reset are lost. Had the new item been at any
    other version, the write would be refused and re-done on the stored record (4 failures of 10, closed)."""
    store = MemoryFlowStore()
    store._breakers[KEY] = policy.Record(state=State.OPEN, open_until_ms=NOW_MS - 1, version=2)
    breaker = Breaker(key=lambda p: KEY, failures=10, window_s=60, cooldown_s=30)
    b = Gate(store, owner="b", now_ms=lambda: NOW_MS)
    a = Gate(store, owner="a", now_ms=lambda: NOW_MS)
    probe = await admit(b, breaker, "probe")
    assert probe.ticket.probe and store._breakers[KEY].version == 3

    del store._breakers[KEY]  # sqs-worker breakers reset host (DeleteItem)

    clock.advance(2.0)
    for n in range(3):  # A's jobs run (closed) and fail: three versions of the new item (were 1, 2, 3)
        ticket = (await admit(a, breaker, n)).ticket
        await a.report(ticket, Outcome.COUNTED, job_type="hook")
    assert store._breakers[KEY].failures == 3

    await b.report(probe.ticket, Outcome.COUNTED, job_type="hook")  # B's probe, started before the reset, fails
    record = store._breakers[KEY]
    assert record.state is State.CLOSED and record.failures == 4, f"reset undone by a stale version match: {record}"


# ------------------------------------------------------------------------------------------------------------ 2b


class LosesOneAnswer:
    """The aiobotocore client, but the first UpdateItem of a breaker item lands and then times out reading the
    answer (botocore's ReadTimeoutError): what a slow or overloaded DynamoDB endpoint does now and then."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ReadTimeoutError

        answer = await self._client.update_item(**kwargs)
        if kwargs["Key"]["key"]["S"].startswith("sqs-worker:breaker:") and self.lost == 0:
            self.lost += 1
            raise ReadTimeoutError(endpoint_url="http://dynamodb.test")
        return answer


async def test_dynamo_one_counted_failure_whose_answer_is_lost_counts_once(backend: Any, dynamodb: Any) -> None:
    import uuid

    from worker.flow.store import DynamoFlowStore
    from worker.idempotency import create_table

    table = f"flow-{uuid.uuid4().hex[:12]}"
    await create_table(dynamodb, table)
    client = LosesOneAnswer(dynamodb)
    store = DynamoFlowStore(client, table)  # type: ignore[arg-type]
    gate = Gate(store, owner="a", now_ms=lambda: NOW_MS)
    breaker = Breaker(key=lambda p: KEY, failures=2, window_s=60, cooldown_s=30)
    ticket = (await admit(gate, breaker, 0)).ticket
    await gate.report(ticket, Outcome.COUNTED, job_type="hook")  # ONE counted failure
    assert client.lost == 1
    record = await DynamoFlowStore(dynamodb, table).breaker(KEY)
    assert record is not None
    assert (record.state, record.failures) == (State.CLOSED, 1), f"one failure of 2 counted twice: {record}"


async def test_dynamo_a_probe_whose_answer_is_lost_still_runs(backend: Any, dynamodb: Any) -> None:
    import uuid

    from worker.flow.store import DynamoFlowStore
    from worker.idempotency import create_table

    table = f"flow-{uuid.uuid4().hex[:12]}"
    await create_table(dynamodb, table)
    plain = DynamoFlowStore(dynamodb, table)
    opened = policy.Record(state=State.OPEN, open_until_ms=NOW_MS - 1, changed_at_ms=NOW_MS - 30_000, version=1)
    assert (await plain.write_breaker(KEY, opened, seen_version=None))[0]
    client = LosesOneAnswer(dynamodb)
    gate = Gate(DynamoFlowStore(client, table), owner="a", now_ms=lambda: NOW_MS)  # type: ignore[arg-type]
    breaker = Breaker(key=lambda p: KEY, failures=2, window_s=60, cooldown_s=30)
    decision = await admit(gate, breaker, "probe")
    record = await plain.breaker(KEY)
    assert record is not None and record.probe_owner == "a:probe"
    assert decision.step is Step.RUN, (
        f"held its own probe back: {decision}; the key waits {record.probe_until_ms - NOW_MS} ms"
    )


# ------------------------------------------------------------------------------------------------------------ 5


async def test_concurrent_counted_failures_of_one_worker_are_all_counted(clock: Clock) -> None:
    """WORKER_CONCURRENCY jobs of one key fail together (the downstream went down: they time out at once). Each
    report starts from the same cached record; every round one write wins and the others are refused; after
    MAX_WRITES rounds the rest give up ('gave up a change after 4 contended writes'): 10 failures count as 4, and
    a breaker of failures=5 does not open. _take_slot serialises one worker's writes of a key for this reason;
    _change does not."""
    store = MemoryFlowStore()

    class OneRoundTrip(Wrapped):
        async def write_breaker(self, key: str, record: policy.Record, *, seen_version: int | None) -> Any:
            await asyncio.sleep(0)  # the request is on the wire: the loop runs the other jobs' reports
            return await self.store.write_breaker(key, record, seen_version=seen_version)

    gate = Gate(OneRoundTrip(store), owner="a", now_ms=lambda: NOW_MS)
    breaker = Breaker(key=lambda p: KEY, failures=5, window_s=60, cooldown_s=30)  # the defaults
    tickets = [(await admit(gate, breaker, n)).ticket for n in range(10)]
    await asyncio.gather(*(gate.report(t, Outcome.COUNTED, job_type="hook") for t in tickets))
    record = store._breakers[KEY]
    assert record.state is State.OPEN, f"10 counted failures of 5 and still closed: {record}"


async def test_dynamo_a_reset_is_not_undone_by_a_stale_version_match(backend: Any, dynamodb: Any) -> None:
    import uuid

    from worker.flow.store import DynamoFlowStore
    from worker.idempotency import create_table

    table = f"flow-{uuid.uuid4().hex[:12]}"
    await create_table(dynamodb, table)
    store = DynamoFlowStore(dynamodb, table)
    opened = policy.Record(state=State.OPEN, open_until_ms=NOW_MS - 1, version=2)
    assert (await store.write_breaker(KEY, opened, seen_version=None))[0]
    breaker = Breaker(key=lambda p: KEY, failures=10, window_s=60, cooldown_s=30)
    b = Gate(DynamoFlowStore(dynamodb, table), owner="b", now_ms=lambda: NOW_MS)
    a = Gate(DynamoFlowStore(dynamodb, table), owner="a", now_ms=lambda: NOW_MS)
    probe = await admit(b, breaker, "probe")
    assert probe.ticket.probe
    assert await store.reset_breaker(KEY)  # sqs-worker breakers reset host
    for n in range(3):
        ticket = (await admit(a, breaker, n)).ticket
        await a.report(ticket, Outcome.COUNTED, job_type="hook")
    await b.report(probe.ticket, Outcome.COUNTED, job_type="hook")
    record = await store.breaker(KEY)
    assert record is not None
    assert record.state is State.CLOSED and record.failures == 4, f"reset undone by a stale version match: {record}"


# ------------------------------------------------------------------------------------------------ answers shuffled


class Shuffled(Wrapped):
    """Each call lands at once but answers after a random number of loop turns (answers out of order)."""

    def __init__(self, store: MemoryFlowStore, rng: random.Random) -> None:
        super().__init__(store)
        self.rng = rng

    async def _later(self, answer: Any) -> Any:
        for _ in range(self.rng.randrange(6)):
            await asyncio.sleep(0)
        return answer

    async def breaker(self, key: str) -> Any:
        return await self._later(await self.store.breaker(key))

    async def write_breaker(self, key: str, record: policy.Record, *, seen_version: int | None) -> Any:
        return await self._later(await self.store.write_breaker(key, record, seen_version=seen_version))


@pytest.mark.parametrize("seed", range(40))
async def test_concurrent_probes_of_one_worker_and_two_workers_take_exactly_one(clock: Clock, seed: int) -> None:
    rng = random.Random(seed)
    store = MemoryFlowStore()
    lapsed = seed % 2 == 1  # open past its cool-down, or half-open with a lapsed lease
    store._breakers[KEY] = (
        policy.Record(state=State.HALF_OPEN, probe_owner="x:1", probe_until_ms=NOW_MS - 1, version=5)
        if lapsed
        else policy.Record(state=State.OPEN, open_until_ms=NOW_MS - 1, version=5)
    )
    gates = [Gate(Shuffled(store, rng), owner=o, now_ms=lambda: NOW_MS) for o in "ab"]
    breaker = Breaker(key=lambda p: KEY, failures=2, window_s=60, cooldown_s=30)
    decisions = await asyncio.gather(*(admit(gates[n % 2], breaker, n) for n in range(8)))
    runs = [d for d in decisions if d.step is Step.RUN]
    assert len(runs) == 1 and runs[0].ticket.probe
    assert store._breakers[KEY].probe_owner == runs[0].ticket.owner
    # the probe's success closes it; concurrent counted failures of non-probes do not reopen it
    await asyncio.gather(
        gates[0].report(runs[0].ticket, Outcome.SUCCEEDED, job_type="hook"),
        *(
            g.report(d.ticket, Outcome.COUNTED, job_type="hook")
            for g, d in zip(gates * 4, decisions, strict=False)
            if d is not runs[0]
        ),
    )
    assert store._breakers[KEY].state is State.CLOSED


@pytest.mark.parametrize("seed", range(40))
async def test_concurrent_counted_failures_are_all_counted(clock: Clock, seed: int) -> None:
    rng = random.Random(seed)
    store = MemoryFlowStore()
    gates = [Gate(Shuffled(store, rng), owner=o, now_ms=lambda: NOW_MS) for o in "ab"]
    breaker = Breaker(key=lambda p: KEY, failures=50, window_s=60, cooldown_s=30)
    tickets = [(await admit(gates[n % 2], breaker, n)).ticket for n in range(6)]
    await asyncio.gather(*(gates[n % 2].report(t, Outcome.COUNTED, job_type="hook") for n, t in enumerate(tickets)))
    assert store._breakers[KEY].failures == 6  # MAX_WRITES=4 can give up under 6-way contention: see report
