"""The in-memory backend's own edges (the shared semantics are checked on every backend in
test_queue_contract.py and the runtime tests marked memory): errors as SQS gives them, waking long polls,
the clock that skips only when nothing is claimed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from worker.backends.aws import content_refused
from worker.backends.batching import EntryFailed
from worker.backends.memory import MemoryBroker
from worker.backends.protocols import MessageQueue
from worker.errors import ConfigError, QueueUnavailable


def test_refused_content_reads_as_sqs_refusals() -> None:
    broker = MemoryBroker()
    queue = broker.create_queue("q", maximum_message_bytes=2048)
    too_many = {f"a{n}": {"DataType": "String", "StringValue": "x"} for n in range(11)}
    for body, attributes in (
        ("x" * 2049, None),
        ("nul \x00 inside", None),
        ("ok", too_many),
        ("ok", {"empty": {"DataType": "String", "StringValue": ""}}),
    ):
        with pytest.raises(QueueUnavailable) as refused:
            broker.send(queue.name, body, attributes=attributes)
        assert content_refused(refused.value), body[:20]
    assert queue.counts().total == 0


async def test_a_send_from_another_thread_wakes_a_long_poll_at_once() -> None:
    broker = MemoryBroker()
    queue: MessageQueue = broker.create_queue("q")
    loop = asyncio.get_running_loop()
    started = loop.time()
    receive = asyncio.create_task(queue.receive(max_messages=10, wait_s=20, visibility_timeout_s=30))
    await asyncio.sleep(0)  # the receive is waiting now
    threading.Thread(target=broker.send, args=("q", "hello")).start()
    [message] = await asyncio.wait_for(receive, timeout=5)
    assert message.body == "hello" and loop.time() - started < 5


async def test_visibility_changes_need_the_latest_handle_of_a_message_in_flight() -> None:
    broker = MemoryBroker()
    queue = broker.create_queue("q")
    broker.send("q", "m")
    [first] = await queue.receive(max_messages=1, wait_s=0, visibility_timeout_s=0)
    [second] = await queue.receive(max_messages=1, wait_s=0, visibility_timeout_s=30)
    with pytest.raises(EntryFailed, match="ReceiptHandleIsInvalid"):
        await queue.set_visibility(first.receipt_handle, 10)
    await queue.delete(first.receipt_handle)  # an old handle: succeeds, deletes nothing (as on SQS)
    assert queue.counts().in_flight == 1
    await queue.delete(second.receipt_handle)
    await queue.delete(second.receipt_handle)  # deleting again succeeds too
    assert queue.counts().total == 0
    with pytest.raises(EntryFailed, match="ReceiptHandleIsInvalid"):
        await queue.delete("not-a-handle")


async def test_the_clock_skips_to_the_next_due_message_but_never_under_a_claim() -> None:
    broker = MemoryBroker()
    queue = broker.create_queue("q")
    broker.send("q", "later", delay_s=600)
    broker.send("q", "now")
    assert broker.advance_to_next_due("q") == 0  # "now" is visible
    [now] = await queue.receive(max_messages=1, wait_s=0, visibility_timeout_s=30)
    assert broker.advance_to_next_due("q") == 0  # "now" is claimed: its consumer may still act on it
    await queue.set_visibility(now.receipt_handle, 900)  # a retry's backoff: parked, no longer claimed
    skipped = broker.advance_to_next_due("q")
    assert 599 < skipped < 601
    [later] = await queue.receive(max_messages=10, wait_s=0, visibility_timeout_s=30)
    assert later.body == "later" and later.receive_count == 1
    await queue.delete(later.receipt_handle)
    assert 299 < broker.advance_to_next_due("q") < 301
    [again] = await queue.receive(max_messages=10, wait_s=0, visibility_timeout_s=30)
    assert (again.body, again.receive_count) == ("now", 2)


async def test_fifo_needs_a_group_deduplicates_and_keeps_ids() -> None:
    broker = MemoryBroker()
    queue = broker.create_queue("q.fifo")
    with pytest.raises(QueueUnavailable, match="MessageGroupId"):
        broker.send("q.fifo", "m", deduplication_id="d")
    with pytest.raises(QueueUnavailable, match="DelaySeconds"):
        broker.send("q.fifo", "m", group_id="g", deduplication_id="d", delay_s=5)
    first = await queue.send("m", group_id="g", deduplication_id="d")
    assert await queue.send("m", group_id="g", deduplication_id="d") == first
    assert queue.counts().total == 1
    with pytest.raises(ConfigError, match="FIFO dead-letter queue"):
        broker.create_queue("other.fifo", dead_letter_queue=broker.create_queue("plain").name, max_receive_count=3)


async def test_a_redrive_keeps_the_message_as_it_was() -> None:
    broker = MemoryBroker()
    dlq = broker.create_queue("q-dlq")
    queue = broker.create_queue("q", dead_letter_queue="q-dlq", max_receive_count=1)
    attributes = {"origin": {"DataType": "String", "StringValue": "billing"}}
    message_id = await queue.send("poison", attributes=attributes)
    assert len(await queue.receive(max_messages=1, wait_s=0, visibility_timeout_s=0)) == 1
    assert await queue.receive(max_messages=1, wait_s=0, visibility_timeout_s=0) == []
    [moved] = dlq.messages()
    assert (moved.message_id, moved.body, moved.message_attributes) == (message_id, "poison", attributes)
    assert await dlq.maximum_message_bytes() == 1_048_576
