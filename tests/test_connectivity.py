"""Reachability as the worker reports it: an outage is calls failing for UNREACHABLE_AFTER_S with none
succeeding; a lone failed call on a flaky network is not one. Each change is reported once."""

from __future__ import annotations

from worker.observability.events import Event, Observers
from worker.runtime.connectivity import UNREACHABLE_AFTER_S, Connectivity


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, bool]] = []

    def emit(self, event: Event) -> None:
        return None

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        return None

    def connectivity(self, *, service: str, reachable: bool) -> None:
        self.changes.append((service, reachable))


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def tracked() -> tuple[Connectivity, Recorder, Clock]:
    recorder, clock = Recorder(), Clock()
    return Connectivity("sqs", Observers([recorder]), monotonic=clock), recorder, clock


def test_the_first_successful_call_reports_the_endpoint_reachable_once() -> None:
    sqs, recorder, _ = tracked()
    sqs.up()
    sqs.up()
    assert recorder.changes == [("sqs", True)]


def test_failed_calls_between_successes_are_no_outage() -> None:
    sqs, recorder, clock = tracked()
    sqs.up()
    for _ in range(50):  # a fifth of the calls fail, each followed by one that succeeds
        clock.now_s += 0.1
        sqs.down(OSError("reset"))
        clock.now_s += UNREACHABLE_AFTER_S
        sqs.up()
    assert recorder.changes == [("sqs", True)]
    assert sqs.reachable is True


def test_calls_failing_for_the_window_make_an_outage_reported_once_and_its_end() -> None:
    sqs, recorder, clock = tracked()
    sqs.up()
    sqs.down(OSError("refused"))
    clock.now_s += UNREACHABLE_AFTER_S - 0.01
    sqs.down(OSError("refused"))
    assert sqs.reachable is True  # not yet: failing for less than the window
    clock.now_s += 0.01
    sqs.down(OSError("refused"))
    clock.now_s += 5
    sqs.down(OSError("refused"))
    assert recorder.changes == [("sqs", True), ("sqs", False)]
    sqs.up()
    assert recorder.changes == [("sqs", True), ("sqs", False), ("sqs", True)]


def test_an_outage_from_the_start_is_reported() -> None:
    sqs, recorder, clock = tracked()
    sqs.down(OSError("refused"))
    clock.now_s += UNREACHABLE_AFTER_S
    sqs.down(OSError("refused"))
    assert recorder.changes == [("sqs", False)]
    assert sqs.reachable is False
