"""The transport retry budgets (pure): delays, giving up, and that each budget's numbers hold (issue 9, item 9)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.budgets import (
    BATCH,
    HOLD_COPY,
    LEDGER,
    NO_RETRY,
    RECEIVE,
    SEND,
    Budget,
    botocore_retries,
    retry_delay_s,
    start_budget,
)

BUDGETS = [RECEIVE, BATCH, SEND, HOLD_COPY, LEDGER, NO_RETRY, start_budget(60.0), start_budget(0.5)]


def schedule(budget: Budget, *, jitter: float, limit: int = 1000) -> list[float]:
    """The delays of a call that always fails, with the clock advanced by the delays alone (instant calls)."""
    delays: list[float] = []
    elapsed_s = 0.0
    while len(delays) < limit:
        delay_s = retry_delay_s(budget=budget, failures=len(delays) + 1, elapsed_s=elapsed_s, jitter=jitter)
        if delay_s is None:
            break
        delays.append(delay_s)
        elapsed_s += delay_s
    return delays


@pytest.mark.parametrize(
    ("budget", "failures", "elapsed_s", "jitter", "expected"),
    [
        (BATCH, 1, 0.0, 1.0, 0.2),
        (BATCH, 1, 0.0, 0.0, 0.1),
        (BATCH, 2, 0.2, 1.0, 0.4),
        (BATCH, 6, 6.0, 1.0, 5.0),  # 0.2 * 2**5 = 6.4, capped at 5
        (BATCH, 50, 59.0, 1.0, 1.0),  # shortened: the last try starts at 60 s
        (BATCH, 50, 60.0, 1.0, None),  # spent
        (BATCH, 2, 75.0, 0.0, None),
        (RECEIVE, 1, 0.0, 1.0, 0.1),
        (RECEIVE, 9, 1e6, 1.0, 20.0),  # never gives up, capped at 20 s
        (RECEIVE, 10_000, 1e9, 0.5, 15.0),  # huge counts do not overflow
        (SEND, 1, 0.0, 1.0, 0.5),
        (SEND, 8, 1e6, 1.0, 30.0),  # never gives up, capped at 30 s
        (LEDGER, 5, 5.0, 1.0, None),
        (NO_RETRY, 1, 0.0, 1.0, None),
    ],
)
def test_retry_delay_s(budget: Budget, failures: int, elapsed_s: float, jitter: float, expected: float | None) -> None:
    assert retry_delay_s(budget=budget, failures=failures, elapsed_s=elapsed_s, jitter=jitter) == (
        pytest.approx(expected) if expected is not None else None
    )


@given(
    budget=st.sampled_from(BUDGETS),
    failures=st.integers(min_value=1, max_value=200),
    elapsed_s=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    jitter=st.floats(min_value=0, max_value=1),
)
def test_delays_stay_within_the_budget(budget: Budget, failures: int, elapsed_s: float, jitter: float) -> None:
    delay_s = retry_delay_s(budget=budget, failures=failures, elapsed_s=elapsed_s, jitter=jitter)
    ceiling_s = min(budget.max_delay_s, budget.first_delay_s * 2.0 ** min(failures - 1, 64))
    if budget.give_up_after_s is not None and elapsed_s >= budget.give_up_after_s:
        assert delay_s is None
        return
    assert delay_s is not None
    assert delay_s <= ceiling_s + 1e-9
    if budget.give_up_after_s is None:
        assert delay_s >= 0.5 * ceiling_s - 1e-9
    else:
        assert elapsed_s + delay_s <= budget.give_up_after_s + 1e-9
        assert delay_s >= min(0.5 * ceiling_s, budget.give_up_after_s - elapsed_s) - 1e-9


@pytest.mark.parametrize("budget", [b for b in BUDGETS if b.give_up_after_s is not None], ids=lambda b: b.calls)
@pytest.mark.parametrize("jitter", [0.0, 0.5, 1.0])
def test_a_call_that_always_fails_is_tried_for_its_budget_then_given_up(budget: Budget, jitter: float) -> None:
    delays = schedule(budget, jitter=jitter)
    assert budget.give_up_after_s is not None
    assert sum(delays) == pytest.approx(budget.give_up_after_s, abs=1e-9) or not delays
    assert len(delays) < 1000


def test_the_documented_numbers() -> None:
    """README, "Endpoint trouble": the numbers a reader relies on."""
    assert len(schedule(BATCH, jitter=1.0)) == 16  # 17 tries: 0.2, 0.4, 0.8, 1.6, 3.2 s, then 5 s up to 60 s
    assert schedule(SEND, jitter=1.0, limit=8) == pytest.approx([0.5, 1, 2, 4, 8, 16, 30, 30])
    assert sum(schedule(LEDGER, jitter=0.0)) == pytest.approx(5.0)
    assert schedule(NO_RETRY, jitter=1.0) == []
    assert schedule(RECEIVE, jitter=1.0, limit=10) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 20, 20])
    assert start_budget(60.0).give_up_after_s == 60.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failures": 0, "elapsed_s": 0.0, "jitter": 0.5}, "failures"),
        ({"failures": 1, "elapsed_s": -1.0, "jitter": 0.5}, "elapsed_s"),
        ({"failures": 1, "elapsed_s": 0.0, "jitter": 1.5}, "jitter"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        retry_delay_s(budget=BATCH, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("first", "most", "give_up"), [(-1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (0.1, 1.0, -1.0)], ids=str)
def test_bad_budgets(first: float, most: float, give_up: float) -> None:
    with pytest.raises(ValueError, match=r"must be|need"):
        Budget("x", first_delay_s=first, max_delay_s=most, give_up_after_s=give_up, then="")


def test_botocore_retries() -> None:
    assert botocore_retries(1) == {"mode": "standard", "total_max_attempts": 1}
    with pytest.raises(ValueError, match="attempts"):
        botocore_retries(0)


def test_the_readme_states_these_budgets() -> None:
    """README, "Endpoint trouble" and "CLI": the table a reader relies on says what this module does."""
    from pathlib import Path

    from worker.budgets import CLI_BOTOCORE_ATTEMPTS
    from worker.settings import WorkerSettings

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    start = start_budget(WorkerSettings(queue="q").start_timeout_s)
    assert f"`WORKER_START_TIMEOUT_S` ({start.give_up_after_s:g} s), {start.first_delay_s:g} s doubling to " in readme
    assert f"| ReceiveMessage | ever, {RECEIVE.first_delay_s:g} s doubling to {RECEIVE.max_delay_s:g} s |" in readme
    assert f"| SendMessage to the DLQ | ever, {SEND.first_delay_s:g} s doubling to {SEND.max_delay_s:g} s |" in readme
    for budget in (BATCH, LEDGER, HOLD_COPY):
        assert budget.give_up_after_s is not None
        numbers = f"{budget.give_up_after_s:g} s, {budget.first_delay_s:g} s doubling to {budget.max_delay_s:g} s"
        assert f"| {numbers} |" in readme, numbers
    assert f"botocore tries each call {CLI_BOTOCORE_ATTEMPTS} times" in readme
