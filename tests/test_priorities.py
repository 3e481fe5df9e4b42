"""The priority policy across queues (worker.flow.priorities): pure, no I/O."""

from __future__ import annotations

import pytest

from worker.flow.priorities import MAX_PER_RECEIVE, AnswerTimes, Grant, Mode, Priorities, QueueSpec, parse_queue_set


def run_one_slot(policy: Priorities, backlog: list[int], steps: int) -> list[int]:
    """A 1-slot worker: each grant's receive brings one message while its queue has any, else goes unanswered
    (lent: a long poll on an empty queue). The order of the queues whose messages ran."""
    order: list[int] = []
    for _ in range(steps):
        grant = policy.next(1)
        if grant is None:
            break
        assert grant.count == 1
        if backlog[grant.index]:
            backlog[grant.index] -= 1
            policy.answered(grant.index, asked=1, received=1, lent=False)
            order.append(grant.index)
        else:
            policy.lent(grant.index, 1)
    return order


def test_parse_queue_set_names_weights_and_urls() -> None:
    assert parse_queue_set("critical:10, default:3,bulk") == (
        QueueSpec("critical", 10),
        QueueSpec("default", 3),
        QueueSpec("bulk", 1),
    )
    url = "http://127.0.0.1:4566/000000000000/jobs"
    assert parse_queue_set(f"{url}:4,{url}-low") == (QueueSpec(url, 4), QueueSpec(f"{url}-low", 1))
    assert parse_queue_set("a: 5") == (QueueSpec("a", 5),)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "names no queue"),
        (" , ", "names no queue"),
        ("a:0", "1..1000"),
        ("a:1001", "1..1000"),
        (":3", "no queue"),
        ("a:x,b", "a weight is a whole number"),  # was a queue named "x"
        ("a:1.5", "a weight is a whole number"),
    ],
)
def test_parse_queue_set_refuses_bad_sets(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_queue_set(text)


def test_a_queue_named_twice_is_refused_even_as_a_url() -> None:
    with pytest.raises(ValueError, match="jobs more than once"):
        parse_queue_set("jobs,http://127.0.0.1:4566/000000000000/jobs:2")


def test_weighted_shares_a_scarce_slot_by_weight_in_a_fixed_order() -> None:
    policy = Priorities([2, 1], mode=Mode.WEIGHTED)
    assert run_one_slot(policy, [6, 6], steps=20) == [0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 1]


def test_weighted_three_queues_by_weight() -> None:
    policy = Priorities([10, 3, 1], mode=Mode.WEIGHTED)
    order = run_one_slot(policy, [1000, 1000, 1000], steps=140)
    assert [order.count(index) for index in range(3)] == [100, 30, 10]


def test_strict_runs_a_lower_queue_only_once_the_higher_one_is_empty() -> None:
    policy = Priorities([1, 1, 1], mode=Mode.STRICT)
    assert run_one_slot(policy, [3, 2, 2], steps=20) == [0, 0, 0, 1, 1, 2, 2]


def test_strict_goes_back_up_as_soon_as_the_higher_queue_answers_with_messages() -> None:
    policy = Priorities([1, 1], mode=Mode.STRICT)
    high = policy.next(1)
    assert high == Grant(0, 1)
    policy.lent(0, 1)  # critical is empty: its long poll waits, its slot is lent
    low = policy.next(1)
    assert low == Grant(1, 1)
    policy.answered(1, asked=1, received=1, lent=False)
    policy.answered(0, asked=1, received=1, lent=True)  # a critical job arrived on the open long poll
    assert policy.next(1) == Grant(0, 1), "bulk is busy too, but critical goes first"
    assert policy.next(1) is None, "bulk waits while critical is busy (one receive there: one message is no backlog)"


def test_an_idle_queue_costs_one_long_poll_holding_one_slot() -> None:
    policy = Priorities([10, 1], mode=Mode.WEIGHTED)
    grants = [policy.next(10), policy.next(10)]
    assert [grant.index for grant in grants if grant] == [0, 1]
    for grant in grants:
        assert grant is not None
        policy.lent(grant.index, grant.count)  # both queues are empty: each long poll waits
    assert policy.next(10) is None, "an open long poll per queue: no other receive on an idle queue"
    policy.answered(0, asked=10, received=0, lent=True)  # the long poll ended empty
    again = policy.next(10)
    assert again == Grant(0, 1), "the next long poll of a queue that was empty holds one slot"


def test_a_receive_asks_for_at_most_the_free_slots_and_ten() -> None:
    policy = Priorities([1, 1], mode=Mode.WEIGHTED)
    assert policy.next(3) == Grant(0, 3)
    assert policy.next(50) == Grant(1, MAX_PER_RECEIVE)


def test_a_queue_asks_for_twice_what_it_last_got() -> None:
    policy = Priorities([1, 1], mode=Mode.WEIGHTED)
    first = policy.next(10)
    assert first == Grant(0, 10)
    policy.answered(0, asked=10, received=2, lent=False)
    assert policy.next(10) == Grant(1, 10)
    assert policy.next(10) == Grant(0, 4)


def test_a_queue_back_from_idle_gets_no_backlog_of_turns() -> None:
    policy = Priorities([1, 1], mode=Mode.WEIGHTED)
    idle = policy.next(1)
    assert idle == Grant(0, 1)
    policy.lent(0, 1)
    for _ in range(50):  # bulk runs alone for a while
        grant = policy.next(1)
        assert grant == Grant(1, 1)
        policy.answered(1, asked=1, received=1, lent=False)
    policy.answered(0, asked=1, received=1, lent=True)  # queue 0 wakes up
    order = []
    for _ in range(6):
        grant = policy.next(1)
        assert grant is not None
        order.append(grant.index)
        policy.answered(grant.index, asked=1, received=1, lent=False)
    assert order.count(0) in (3, 4) and 1 in order[:3], f"shared by weight from now on, not 50 turns owed: {order}"


def test_a_single_queue_is_todays_worker() -> None:
    policy = Priorities([1], mode=Mode.STRICT)
    assert policy.next(25) == Grant(0, 10)
    assert policy.next(4) == Grant(0, 4), "every free slot goes to it, whatever receives are open"
    assert not policy.hedges(0) or policy.queues[0].busy
    policy.lent(0, 4)
    assert policy.next(1) == Grant(0, 1), "a stalled receive does not stop the next one"
    policy.answered(0, asked=10, received=0, lent=False)
    assert not policy.hedges(0), "a long poll on an empty single queue keeps its slots (as before)"


def test_a_failed_receive_leaves_the_queue_eligible() -> None:
    policy = Priorities([1, 1], mode=Mode.STRICT)
    grant = policy.next(5)
    assert grant == Grant(0, 5)
    policy.failed(0, asked=5, lent=False)
    assert policy.next(5) == Grant(0, 5)


def test_the_policy_refuses_an_empty_set_and_bad_weights() -> None:
    with pytest.raises(ValueError, match="at least one queue"):
        Priorities([])
    with pytest.raises(ValueError, match="weights"):
        Priorities([1, 0])


def test_a_busy_queue_gets_one_more_receive_past_a_stalled_one_then_counts_as_empty() -> None:
    policy = Priorities([1, 1], mode=Mode.STRICT)
    assert policy.next(10) == Grant(0, 10)
    policy.answered(0, asked=10, received=10, lent=False)  # busy
    assert policy.next(10) == Grant(0, 10)
    policy.lent(0, 10)  # unanswered: a slow endpoint, or the queue just emptied
    assert policy.next(10) == Grant(0, 10), "one more receive on the busy queue; the lower one still waits"
    policy.lent(0, 10)  # the second in a row: it is empty
    assert policy.next(10) == Grant(1, 10), "now the lower queue receives"
    assert policy.next(10) is None


def test_a_trickling_queue_gets_one_receive_at_a_time_and_no_more_slots() -> None:
    policy = Priorities([10, 1], mode=Mode.WEIGHTED)
    assert policy.next(20) == Grant(0, 10)
    assert policy.next(10) == Grant(1, 10)
    policy.answered(0, asked=10, received=1, lent=False)  # a message now and then: no backlog
    policy.answered(1, asked=10, received=10, lent=False)  # a backlog
    grants = [policy.next(20) for _ in range(6)]
    assert [grant.index for grant in grants if grant] == [0, 1, 1, 1, 1, 1]
    assert grants[0] == Grant(0, 2), "one receive for the trickling queue, for twice what it last got"
    policy.lent(0, 2)  # its receive waits: the queue is empty, not stalled
    assert not policy.queues[0].busy


def test_the_usual_answer_time_sees_through_answers_that_waited_for_an_arrival() -> None:
    times = AnswerTimes(floor_s=0.05, initial_s=0.1)
    assert times.empty_after_s() == pytest.approx(0.5)
    for waited_s in (0.8, 0.01, 0.3, 0.012, 0.9, 0.011, 0.5, 0.013):  # long polls that waited, and prompt answers
        times.observe(waited_s)
    assert times.typical_s == pytest.approx(0.012)
    assert times.empty_after_s() == pytest.approx(0.06)
    for _ in range(3):
        times.observe(0.001)
    assert times.empty_after_s() == 0.05, "never below the floor"


def test_one_message_for_one_asked_after_a_wait_is_no_backlog() -> None:
    policy = Priorities([1, 1], mode=Mode.WEIGHTED)
    assert policy.next(1) == Grant(0, 1)
    policy.lent(0, 1)  # a long poll: unanswered at first
    policy.answered(0, asked=1, received=1, lent=True)  # then a job arrived
    assert policy.next(20) == Grant(1, 10)
    assert policy.next(20) == Grant(0, 2)
    assert policy.next(20) is None, "queue 0 got one message for one asked, after a wait: one receive at a time"


def test_one_message_for_one_asked_at_once_is_a_backlog() -> None:
    policy = Priorities([1, 1], mode=Mode.WEIGHTED)
    assert policy.next(1) == Grant(0, 1)
    policy.answered(0, asked=1, received=1, lent=False)  # SQS answered at once: slots free one at a time
    assert policy.next(20) == Grant(1, 10)
    assert policy.next(20) == Grant(0, 2)
    assert policy.next(20) == Grant(0, 2), "a backlog: more than one receive at a time"


@pytest.mark.parametrize("answer_after", [0, 1, 2, 5])
def test_weighted_shares_hold_when_receives_take_longer_than_slots_take_to_free(answer_after: int) -> None:
    """Slots free one at a time, each receive answers (in full) ``answer_after`` slot-frees later: with one
    receive at a time per one-for-one queue, every slot freed meanwhile went to bulk (50% instead of 91%)."""
    policy = Priorities([10, 1], mode=Mode.WEIGHTED)
    pending: list[tuple[int, Grant]] = []
    got, free = [0, 0], 0
    for step in range(5_000):
        free += 1
        for due, answered in [p for p in pending if p[0] <= step]:
            pending.remove((due, answered))
            policy.answered(answered.index, asked=answered.count, received=answered.count, lent=False)
            got[answered.index] += answered.count
        while free and (grant := policy.next(free)) is not None:
            free -= grant.count
            pending.append((step + answer_after, grant))
    assert got[0] / sum(got) == pytest.approx(10 / 11, abs=0.01)


def test_strict_lets_a_lower_queue_receive_once_the_higher_answer_was_partial() -> None:
    policy = Priorities([1, 1], mode=Mode.STRICT)
    assert policy.next(20) == Grant(0, 10)
    policy.answered(0, asked=10, received=10, lent=False)  # full: critical may hold more
    assert policy.next(20) == Grant(0, 10)
    assert policy.next(20) == Grant(0, 10)
    policy.answered(0, asked=10, received=3, lent=False)  # partial: SQS had no more
    assert policy.next(20) == Grant(1, 10), "critical is drained: bulk receives"
    policy.answered(0, asked=10, received=10, lent=False)  # critical full again
    assert policy.next(20) == Grant(0, 10), "critical first"


def test_one_slow_answer_after_a_full_one_does_not_let_a_lower_queue_in() -> None:
    """A 1-slot worker: the endpoint is slow once while critical still has messages."""
    policy = Priorities([1, 1], mode=Mode.STRICT)
    assert policy.next(1) == Grant(0, 1)
    policy.answered(0, asked=1, received=1, lent=False)  # full: one for one
    assert policy.next(1) == Grant(0, 1)
    policy.lent(0, 1)  # slow: a stall, not yet an empty queue
    assert policy.queues[0].busy
    assert policy.next(1) == Grant(0, 1), "one more receive on critical, not bulk"
    policy.lent(0, 1)  # a second one in a row: critical is empty
    assert policy.next(1) == Grant(1, 1)
