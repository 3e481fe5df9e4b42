"""Pure policies of long delays (due time, hops) and attempt accounting (runs, not receives)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.errors import ConfigError
from worker.flow.attempts import (
    MAX_RECEIVES,
    MAX_RUNS,
    RECEIVES_ATTRIBUTE,
    RUNS_ATTRIBUTE,
    HoldMemory,
    counts_of,
    held_copy_attributes,
    without_counts,
)
from worker.flow.delays import (
    DUE_AT_ATTRIBUTE,
    MAX_DELAY_S,
    DueAction,
    due_action,
    due_at_of,
    format_due_at,
    hop_s,
    hops_needed,
    parse_due_at,
    schedule,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def attr(value: str, data_type: str = "String") -> dict[str, str]:
    return {"DataType": data_type, "StringValue": value}


# ------------------------------------------------------------------------------------------- due time, hops


def test_a_delay_within_one_hop_is_sqs_delay_seconds_alone() -> None:
    assert schedule(delay_s=0, run_at=None, now=NOW).due_at is None
    plain = schedule(delay_s=900, run_at=None, now=NOW)
    assert (plain.delay_s, plain.due_at) == (900, None)


def test_a_delay_past_one_hop_carries_its_due_time_and_starts_with_a_full_hop() -> None:
    long = schedule(delay_s=1200, run_at=None, now=NOW)
    assert long.delay_s == 900
    assert long.due_at == NOW + timedelta(seconds=1200)


def test_run_at_always_carries_its_due_time() -> None:
    soon = schedule(delay_s=0, run_at=NOW + timedelta(seconds=10.2), now=NOW)
    assert soon.delay_s == 11  # rounded up: never visible before it is due
    assert soon.due_at == NOW + timedelta(seconds=10.2)
    past = schedule(delay_s=0, run_at=NOW - timedelta(hours=1), now=NOW)
    assert past.delay_s == 0
    offset = schedule(delay_s=0, run_at=datetime(2026, 11, 30, 14, 0, tzinfo=timezone(timedelta(hours=2))), now=NOW)
    assert offset.due_at == NOW and offset.delay_s == 0


@pytest.mark.parametrize(
    ("delay_s", "run_at", "message"),
    [
        (-1, None, "between 0 and"),
        (MAX_DELAY_S + 1, None, "between 0 and"),
        (10, NOW, "not both"),
        (0, datetime(2026, 12, 1), "timezone"),
        (0, NOW + timedelta(seconds=MAX_DELAY_S + 1), "a year"),
        (0, datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), "has no UTC time"),
        (0, datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1))), "has no UTC time"),
    ],
)
def test_bad_delays_are_refused_clearly(delay_s: int, run_at: datetime | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        schedule(delay_s=delay_s, run_at=run_at, now=NOW)


def test_a_year_is_allowed() -> None:
    assert schedule(delay_s=MAX_DELAY_S, run_at=None, now=NOW).delay_s == 900


def test_due_time_text_round_trips_and_bad_text_is_refused() -> None:
    moment = NOW + timedelta(milliseconds=123)
    assert format_due_at(moment) == "2026-11-30T12:00:00.123Z"
    assert parse_due_at(format_due_at(moment)) == moment
    assert due_at_of({DUE_AT_ATTRIBUTE: attr("2026-11-30T13:00:00+01:00")}) == NOW
    assert due_at_of({"other": attr("x")}) is None
    for bad, problem in (("tomorrow", "Invalid isoformat"), ("2026-11-30T12:00:00", "no timezone")):
        with pytest.raises(ValueError, match=problem):
            due_at_of({DUE_AT_ATTRIBUTE: attr(bad)})
    with pytest.raises(ValueError, match="not a String"):
        due_at_of({DUE_AT_ATTRIBUTE: {"DataType": "Binary", "BinaryValue": b"x"}})


@pytest.mark.parametrize(
    ("remaining_s", "expected"),
    [
        (None, DueAction("run")),
        (-5.0, DueAction("run")),
        (0.0, DueAction("run")),
        (0.4, DueAction("wait", 0.4)),
        (1.0, DueAction("wait", 1.0)),
        (1.2, DueAction("hop", 2.0)),
        (899.5, DueAction("hop", 900.0)),
        (1200.0, DueAction("hop", 900.0)),
        (365 * 86400.0, DueAction("hop", 900.0)),
    ],
)
def test_due_action(remaining_s: float | None, expected: DueAction) -> None:
    due_at = None if remaining_s is None else NOW + timedelta(seconds=remaining_s)
    assert due_action(due_at=due_at, now=NOW) == expected


@given(remaining_s=st.floats(min_value=-1e6, max_value=MAX_DELAY_S), max_hop_s=st.integers(1, 900))
def test_hops_never_overshoot_and_always_progress(remaining_s: float, max_hop_s: int) -> None:
    due_at = NOW + timedelta(seconds=remaining_s)
    hop = hop_s(due_at=due_at, now=NOW, max_hop_s=max_hop_s)
    remaining_s = (due_at - NOW).total_seconds()  # as datetimes hold it (microseconds)
    assert 0 <= hop <= max_hop_s
    if remaining_s > 0:
        assert hop >= 1
        assert hop < remaining_s + 1  # visible at most a second after the due time


def test_a_twenty_minute_delay_walks_to_its_due_time_by_hops() -> None:
    """Clock injected: each receive at the moment the previous hop ends (plus a 0.3 s receive latency)."""
    due_at = NOW + timedelta(minutes=20)
    now, hops = NOW, []
    first = schedule(delay_s=1200, run_at=None, now=now)
    now += timedelta(seconds=first.delay_s + 0.3)
    while (action := due_action(due_at=due_at, now=now)).action == "hop":
        hops.append(action.seconds)
        now += timedelta(seconds=action.seconds + 0.3)
    assert hops == [300.0]
    assert action.action == "run" and now >= due_at
    assert (now - due_at).total_seconds() < 1.0
    assert hops_needed(1200) == 1
    assert hops_needed(900) == 0
    assert hops_needed(365 * 86400) == 35039


# ------------------------------------------------------------------------------------------- attempts


def test_a_message_never_held_counts_its_receives() -> None:
    counts = counts_of(message_attributes={}, approximate_receive_count=3)
    assert (counts.attempt, counts.receive_count) == (3, 3)


def test_a_copy_carries_runs_and_receives_and_holds_cost_no_attempt() -> None:
    # Received 4 times in all: ran twice, then held back twice (each hold sends a copy).
    first = counts_of(message_attributes={}, approximate_receive_count=2)  # two runs (retries in place)
    assert first.attempt == 2
    second_receive = counts_of(message_attributes={}, approximate_receive_count=3)  # third receive: held back
    copy = held_copy_attributes({"trace": attr("abc")}, attempt=second_receive.attempt, receive_count=3)
    assert copy[RUNS_ATTRIBUTE] == {"DataType": "Number", "StringValue": "2"}
    assert copy[RECEIVES_ATTRIBUTE] == {"DataType": "Number", "StringValue": "3"}
    assert copy["trace"] == attr("abc")
    on_copy = counts_of(message_attributes=copy, approximate_receive_count=1)  # held back again
    assert (on_copy.attempt, on_copy.receive_count) == (3, 4)
    again = held_copy_attributes(copy, attempt=on_copy.attempt, receive_count=on_copy.receive_count)
    runs = counts_of(message_attributes=again, approximate_receive_count=1)
    assert (runs.attempt, runs.receive_count) == (3, 5)  # the third run, on the fifth receive


def test_holds_in_place_are_subtracted_while_remembered() -> None:
    memory = HoldMemory(capacity=2)
    memory.note("a")
    memory.note("a")
    memory.note("b")
    counts = counts_of(message_attributes={}, approximate_receive_count=3, holds_here=memory.count("a"))
    assert (counts.attempt, counts.receive_count) == (1, 3)
    memory.note("c")  # "a" is the oldest: forgotten
    assert memory.count("a") == 0 and memory.count("c") == 1
    memory.forget("c")
    assert memory.count("c") == 0


@pytest.mark.parametrize("bad", ["x", "", "1.5", "-3", "99999999999999999999", "10001", "1_0", " 3", "+3", "٣"])
def test_an_unreadable_count_counts_as_none(bad: str) -> None:
    counts = counts_of(
        message_attributes={RUNS_ATTRIBUTE: attr(bad, "Number"), RECEIVES_ATTRIBUTE: attr(bad + "0" * 7, "Number")},
        approximate_receive_count=2,
    )
    assert (counts.attempt, counts.receive_count) == (2, 2)


def test_counts_up_to_their_bounds_are_read() -> None:
    attributes = {RUNS_ATTRIBUTE: attr(str(MAX_RUNS), "Number"), RECEIVES_ATTRIBUTE: attr(str(MAX_RECEIVES), "Number")}
    counts = counts_of(message_attributes=attributes, approximate_receive_count=1)
    assert (counts.attempt, counts.receive_count) == (MAX_RUNS + 1, MAX_RECEIVES + 1)


def test_dead_letter_and_redrive_drop_the_counts() -> None:
    attributes = {RUNS_ATTRIBUTE: attr("1"), RECEIVES_ATTRIBUTE: attr("2"), DUE_AT_ATTRIBUTE: attr("x"), "t": attr("y")}
    assert set(without_counts(attributes)) == {DUE_AT_ATTRIBUTE, "t"}
