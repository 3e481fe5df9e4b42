"""The pure retry policy: backoff delays and failure classification."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker import PermanentError, RetryableError
from worker.jobs import DEFAULT_BUG_ERRORS
from worker.policy import MAX_VISIBILITY_S, Action, backoff_delay_s, classify_failure, visibility_cap_s


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base_s=st.floats(min_value=0.1, max_value=600),
    max_s=st.floats(min_value=0.1, max_value=43_200),
    jitter=st.floats(min_value=0, max_value=1),
)
def test_backoff_is_between_half_and_all_of_the_capped_exponential(
    attempt: int, base_s: float, max_s: float, jitter: float
) -> None:
    ceiling = min(max_s, base_s * 2 ** (attempt - 1))
    delay = backoff_delay_s(attempt, base_s=base_s, max_s=max_s, jitter=jitter)
    assert isinstance(delay, int)
    assert math.ceil(ceiling * 0.5 - 1e-9) <= delay <= math.ceil(ceiling)
    assert delay <= MAX_VISIBILITY_S


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(1, 1, 2), (2, 2, 4), (3, 4, 8), (4, 8, 16), (5, 16, 32), (10, 30, 60), (40, 30, 60)],
)
def test_backoff_grows_then_caps(attempt: int, low: int, high: int) -> None:
    assert backoff_delay_s(attempt, base_s=2, max_s=60, jitter=0) == low
    assert backoff_delay_s(attempt, base_s=2, max_s=60, jitter=1) == high


def test_backoff_spreads_a_burst() -> None:
    rng = random.Random(7)
    delays = {backoff_delay_s(6, base_s=2, max_s=900, rng=rng) for _ in range(100)}
    assert len(delays) > 10
    assert min(delays) >= 32 and max(delays) <= 64


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError, match="1-based"):
        backoff_delay_s(0, base_s=1, max_s=1)


def classify(error: BaseException, attempt: int = 1, max_attempts: int = 5, **kwargs: object) -> tuple[Action, object]:
    decision = classify_failure(
        error,
        attempt=attempt,
        max_attempts=max_attempts,
        bugs=DEFAULT_BUG_ERRORS,
        backoff_base_s=2,
        backoff_max_s=60,
        jitter=1,
        **kwargs,  # type: ignore[arg-type]
    )
    return decision.action, decision.category or decision.delay_s


class Declined(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "attempt", "expected"),
    [
        (PermanentError("no"), 1, (Action.DEAD_LETTER, "permanent")),
        (PermanentError("no"), 5, (Action.DEAD_LETTER, "permanent")),
        (RetryableError("later"), 1, (Action.RETRY, 2)),
        (RetryableError("later", delay_s=37.2), 1, (Action.RETRY, 38)),
        (RetryableError("later", delay_s=99_999), 1, (Action.RETRY, MAX_VISIBILITY_S)),
        (RetryableError("later", delay_s=5), 5, (Action.DEAD_LETTER, "exhausted")),
        (TimeoutError(), 2, (Action.RETRY, 4)),
        (TimeoutError(), 5, (Action.DEAD_LETTER, "exhausted")),
        (ConnectionError("refused"), 3, (Action.RETRY, 8)),
        (ConnectionError("refused"), 5, (Action.DEAD_LETTER, "exhausted")),
        (KeyError("x"), 1, (Action.RETRY, 2)),
        (TypeError("bad call"), 1, (Action.DEAD_LETTER, "bug")),
        (AttributeError("no attr"), 1, (Action.DEAD_LETTER, "bug")),
        (NameError("undefined"), 1, (Action.DEAD_LETTER, "bug")),
        (UnboundLocalError("x"), 1, (Action.DEAD_LETTER, "bug")),
    ],
)
def test_classification(error: BaseException, attempt: int, expected: tuple[Action, object]) -> None:
    assert classify(error, attempt) == expected


def test_job_permanent_types_are_never_retried() -> None:
    assert classify(Declined("card declined"), permanent=(Declined,)) == (Action.DEAD_LETTER, "permanent")


def test_bugs_can_be_made_retryable_per_job() -> None:
    decision = classify_failure(
        TypeError("flaky library"), attempt=1, max_attempts=3, bugs=(), backoff_base_s=1, backoff_max_s=1, jitter=1
    )
    assert decision.action is Action.RETRY


def test_retryable_error_rejects_negative_delay() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        RetryableError("x", delay_s=-1)


def test_visibility_cap_counts_from_the_receive() -> None:
    assert visibility_cap_s(elapsed_since_receive_s=0) == MAX_VISIBILITY_S - 5
    assert visibility_cap_s(elapsed_since_receive_s=43_000) == 195
    assert visibility_cap_s(elapsed_since_receive_s=50_000) == 0
