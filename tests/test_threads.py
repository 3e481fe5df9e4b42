"""The threads of plain ``def`` handlers: timeouts from the start, stuck threads replaced, bounded, reported.

Handlers block on ``threading.Event``s the tests set; a timeout that must fire is short (the handler is blocked,
so it certainly overruns), one that must not is long.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from worker.runtime.threads import JobThreads, thread_limit

BLOCKED_S = 10.0  # how long a blocked handler waits for its event at most (bounds a failing test)
SHORT_TIMEOUT_S = 0.05  # a handler blocked on an event certainly overruns this
LONG_TIMEOUT_S = 30.0  # never reached in a passing test


def blocked(
    release: threading.Event,
    started: threading.Event | None = None,
    value: str = "done",
    ran_in: list[threading.Thread] | None = None,
) -> Callable[[], str]:
    def call() -> str:
        if ran_in is not None:
            ran_in.append(threading.current_thread())
        if started is not None:
            started.set()
        release.wait(BLOCKED_S)
        return value

    return call


async def join(thread: threading.Thread) -> None:
    await asyncio.to_thread(thread.join, BLOCKED_S)
    assert not thread.is_alive()


@pytest.fixture
def releases() -> Iterator[list[threading.Event]]:
    """Events the test's handlers block on; all set at the end so no thread outlives the test for long."""
    events: list[threading.Event] = []
    yield events
    for event in events:
        event.set()


def event(releases: list[threading.Event]) -> threading.Event:
    releases.append(threading.Event())
    return releases[-1]


async def test_a_call_returns_its_result_and_raises_its_error() -> None:
    threads = JobThreads(2)

    def boom() -> None:
        raise ValueError("bad row")

    assert await threads.run(lambda: 42, timeout_s=LONG_TIMEOUT_S) == 42
    with pytest.raises(ValueError, match="bad row"):
        await threads.run(boom, timeout_s=LONG_TIMEOUT_S)
    assert threads.stuck == 0
    threads.close()


async def test_a_handler_raising_timeout_error_is_not_reported_as_overrun() -> None:
    threads = JobThreads(1)

    def slow_api() -> None:
        raise TimeoutError("upstream took too long")

    with pytest.raises(TimeoutError, match="upstream took too long"):
        await threads.run(slow_api, timeout_s=LONG_TIMEOUT_S)
    assert threads.stuck == 0
    threads.close()


async def test_an_overrunning_call_times_out_and_its_replacement_serves_the_next(
    releases: list[threading.Event], caplog: pytest.LogCaptureFixture
) -> None:
    threads = JobThreads(1)
    release = event(releases)
    ran_in: list[threading.Thread] = []
    with pytest.raises(TimeoutError):
        await threads.run(
            blocked(release, ran_in=ran_in), timeout_s=SHORT_TIMEOUT_S, log_fields={"job_type": "import_rows"}
        )
    assert threads.stuck == 1 and not threads.all_stuck
    stuck_lines = [r for r in caplog.records if getattr(r, "event", None) == "thread_stuck"]
    assert len(stuck_lines) == 1 and stuck_lines[0].job_type == "import_rows"  # type: ignore[attr-defined]
    assert "timeout_s=0.05" in stuck_lines[0].getMessage()
    # The next call gets a healthy thread at once although the stuck one still runs (bounded: were the stuck
    # thread counted as capacity, the call would wait for a thread forever).
    quick = asyncio.ensure_future(threads.run(lambda: "quick", timeout_s=LONG_TIMEOUT_S))
    done, _ = await asyncio.wait({quick}, timeout=5)
    if not done:
        quick.cancel()
        await asyncio.gather(quick, return_exceptions=True)
    assert done, "the next call got no thread: the stuck thread still counts as capacity"
    assert quick.result() == "quick"
    assert threads.threads == 2
    release.set()
    # Back to one healthy thread: the stuck one, finished, is surplus and ends.
    await join(ran_in[0])
    assert threads.stuck == 0 and threads.threads == 1
    threads.close()


async def test_the_timeout_counts_from_the_start_not_from_the_submission(releases: list[threading.Event]) -> None:
    """A call that waited an hour for a thread (a fake clock) still gets its whole timeout once it starts."""
    now = [1000.0]
    threads = JobThreads(1, max_threads=1, monotonic=lambda: now[0])
    release, started = event(releases), threading.Event()
    first = asyncio.ensure_future(threads.run(blocked(release, started), timeout_s=LONG_TIMEOUT_S))
    await asyncio.to_thread(started.wait, BLOCKED_S)
    second = asyncio.ensure_future(threads.run(lambda: "second", timeout_s=5.0))
    await asyncio.sleep(0)  # let it queue
    now[0] += 3600.0  # it waits for the only thread far longer than its timeout
    release.set()
    assert await first == "done"
    assert await second == "second"
    threads.close()


async def test_threads_are_bounded_and_all_stuck_is_reported(
    releases: list[threading.Event], caplog: pytest.LogCaptureFixture
) -> None:
    threads = JobThreads(1)  # at most 2 threads
    assert threads.max_threads == thread_limit(1) == 2
    first, second = event(releases), event(releases)
    for release in (first, second):
        with pytest.raises(TimeoutError):
            await threads.run(blocked(release), timeout_s=SHORT_TIMEOUT_S)
    assert threads.stuck == 2 and threads.all_stuck and threads.threads == 2
    # No third thread: the next job waits (and that is logged once), then runs when a stuck thread comes back.
    waiting = asyncio.ensure_future(threads.run(lambda: "waited", timeout_s=LONG_TIMEOUT_S))
    await asyncio.sleep(0)
    assert not waiting.done() and threads.threads == 2
    assert [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "threads_exhausted"] == [
        "every handler thread is busy, 2 of 2 stuck: plain def jobs wait for a thread"
    ]
    first.set()
    assert await waiting == "waited"
    assert threads.stuck == 1 and not threads.all_stuck
    threads.close()


async def test_a_call_cancelled_before_its_start_never_runs(releases: list[threading.Event]) -> None:
    threads = JobThreads(1, max_threads=1)
    release, started = event(releases), threading.Event()
    busy = asyncio.ensure_future(threads.run(blocked(release, started), timeout_s=LONG_TIMEOUT_S))
    await asyncio.to_thread(started.wait, BLOCKED_S)
    ran: list[str] = []
    queued = asyncio.ensure_future(threads.run(lambda: ran.append("queued"), timeout_s=LONG_TIMEOUT_S))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    assert await busy == "done"
    assert await threads.run(lambda: "after", timeout_s=LONG_TIMEOUT_S) == "after"  # the queue moved on
    assert ran == []
    threads.close()


async def test_a_cancelled_running_call_is_given_up_and_stuck(releases: list[threading.Event]) -> None:
    threads = JobThreads(1)
    release, started = event(releases), threading.Event()
    owner = object()
    ran_in: list[threading.Thread] = []
    call = blocked(release, started, ran_in=ran_in)
    task = asyncio.ensure_future(threads.run(call, timeout_s=LONG_TIMEOUT_S, owner=owner))
    await asyncio.to_thread(started.wait, BLOCKED_S)
    assert threads.is_running(owner)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert threads.stuck == 1 and threads.is_running(owner)
    threads.close()
    release.set()
    await join(ran_in[0])
    assert not threads.is_running(owner) and threads.stuck == 0


async def test_within_the_wait_on_cancel_window_a_finishing_call_keeps_its_result(
    releases: list[threading.Event],
) -> None:
    """Shutdown: a handler that finishes after its job was cancelled, but within the window, delivers its result."""
    threads = JobThreads(1)
    release, started = event(releases), threading.Event()
    task = asyncio.ensure_future(threads.run(blocked(release, started, "finished"), timeout_s=LONG_TIMEOUT_S))
    await asyncio.to_thread(started.wait, BLOCKED_S)
    threads.wait_on_cancel(LONG_TIMEOUT_S)
    task.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the call, which keeps waiting for its thread
    release.set()
    assert await task == "finished"
    assert threads.stuck == 0
    threads.close()


async def test_past_the_wait_on_cancel_window_the_call_is_given_up(releases: list[threading.Event]) -> None:
    threads = JobThreads(1)
    release, started = event(releases), threading.Event()
    owner = object()
    task = asyncio.ensure_future(threads.run(blocked(release, started), timeout_s=LONG_TIMEOUT_S, owner=owner))
    await asyncio.to_thread(started.wait, BLOCKED_S)
    threads.wait_on_cancel(SHORT_TIMEOUT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert threads.is_running(owner) and threads.stuck == 1
    threads.close()


async def test_threads_are_daemons_and_end_when_closed() -> None:
    threads = JobThreads(3, name="daemon-test")
    names = await asyncio.gather(
        *(threads.run(lambda: threading.current_thread().name, timeout_s=LONG_TIMEOUT_S) for _ in range(3))
    )
    assert all(name.startswith("daemon-test-") for name in names)
    ours = [t for t in threading.enumerate() if t.name.startswith("daemon-test-")]
    assert ours and all(t.daemon for t in ours)  # the interpreter does not wait for them at exit
    threads.close()
    for thread in ours:
        await asyncio.to_thread(thread.join, BLOCKED_S)
    assert threads.threads == 0


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="size"):
        JobThreads(0)
    with pytest.raises(ValueError, match="max_threads"):
        JobThreads(2, max_threads=1)
