"""A redrive moves the messages that were in the DLQ when it started, each once, while a worker dead-letters
them again (issue 9, item 1): against each backend, by receive/send/delete and (LocalStack) by move task."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from tests.test_dlq import BODY, count, dead_letter
from worker.commands.__main__ import main
from worker.ops.bootstrap import Created
from worker.ops.dlq import DeadLetterQueue, redrive_by_receiving
from worker.ops.dlq_records import DeadLetter, Snapshot, move_task_poll_s
from worker.ops.progress import Progress, RateLimiter

pytestmark = pytest.mark.usefixtures("restore_logging")


def dead_letter_again(client: Any, queues: Created, messages: list[Any]) -> list[str]:
    """Do what the worker does for a job that fails at once: send each message received from the source to the
    DLQ (naming it as ``original_message_id``), then delete it from the source. Returns their source MessageIds."""
    for message in messages:
        client.send_message(
            QueueUrl=queues.dlq_url,
            MessageBody=message["Body"],
            MessageAttributes={
                "error_category": {"DataType": "String", "StringValue": "bug"},
                "original_message_id": {"DataType": "String", "StringValue": message["MessageId"]},
            },
        )
        client.delete_message(QueueUrl=queues.queue_url, ReceiptHandle=message["ReceiptHandle"])
    return [message["MessageId"] for message in messages]


class PoisonWorker(threading.Thread):
    """Receives from the source queue and dead-letters every message at once, as the worker does for a job that
    fails for good: a new DLQ message with the body and ``original_message_id``, then a delete."""

    def __init__(self, endpoint_url: str, queues: Created) -> None:
        super().__init__(daemon=True)
        self.client = sqs_client(endpoint_url)
        self.queues = queues
        self.received: list[str] = []  # source MessageIds, in order
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            response = self.client.receive_message(
                QueueUrl=self.queues.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            self.received.extend(dead_letter_again(self.client, self.queues, response.get("Messages", [])))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


def redrive_beside(
    backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str], *argv: str, timeout_s: float
) -> tuple[int | None, str, PoisonWorker]:
    """Run ``sqs-worker dlq redrive --yes ARGV`` while a PoisonWorker consumes the source; bounded: when the
    redrive has not ended after ``timeout_s``, the poison worker stops (so the DLQ can empty) and the exit code
    is None. Otherwise the poison worker keeps running: :func:`settle` stops it."""
    worker = PoisonWorker(backend.endpoint_url, queues)
    worker.start()
    outcome: dict[str, Any] = {}
    redrive = threading.Thread(target=lambda: outcome.update(code=main(["dlq", "redrive", "--yes", *argv])))
    redrive.start()
    redrive.join(timeout_s)
    ended = not redrive.is_alive()
    if not ended:
        worker.stop()
        _cancel_move_tasks(backend, queues)
        redrive.join(120)
    out, _ = capsys.readouterr()
    return (outcome.get("code") if ended else None), out, worker


def _cancel_move_tasks(backend: Backend, queues: Created) -> None:
    client = sqs_client(backend.endpoint_url)
    if backend.name != "localstack":
        return
    arn = client.get_queue_attributes(QueueUrl=queues.dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for task in client.list_message_move_tasks(SourceArn=arn, MaxResults=10).get("Results", []):
        if task.get("Status") == "RUNNING":
            client.cancel_message_move_task(TaskHandle=task["TaskHandle"])


def settle(worker: PoisonWorker, backend: Backend, queues: Created, expected: int, timeout_s: float = 15) -> None:
    """Wait (bounded) until the poison worker has dead-lettered ``expected`` messages again and the source queue is
    empty, then stop it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(worker.received) >= expected and count(backend.endpoint_url, queues.queue_url) == 0:
            break
        time.sleep(0.05)  # another thread's progress: nothing to await
    worker.stop()


def test_receive_send_delete_moves_the_snapshot_once(
    backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(6):
        dead_letter(backend.endpoint_url, queues.dlq_url, BODY, category="bug", error="TypeError: boom")
    code, out, worker = redrive_beside(backend, queues, capsys, "--no-move-task", timeout_s=30)
    assert code == 0, f"the redrive did not end while a worker dead-lettered its messages again ({out!r})"
    assert "moved 6 of 6 by receive-send-delete" in out
    settle(worker, backend, queues, 6)
    # Each of the 6 reached the source once; dead-lettered again, they wait in the DLQ for the next redrive.
    assert len(worker.received) == 6
    assert len(set(worker.received)) == 6
    assert count(backend.endpoint_url, queues.dlq_url) == 6
    assert count(backend.endpoint_url, queues.queue_url) == 0


def test_move_task_is_stopped_at_its_snapshot(
    backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]
) -> None:
    if backend.name != "localstack":
        pytest.skip("moto has no StartMessageMoveTask (its fallback is the test above)")
    for _ in range(30):
        dead_letter(backend.endpoint_url, queues.dlq_url, BODY, category="bug", error="TypeError: boom")
    code, out, worker = redrive_beside(backend, queues, capsys, "--rate", "20/s", timeout_s=30)
    assert code == 0, f"the move task did not end while a worker dead-lettered its messages again ({out!r})"
    assert "moved 30 of 30 by move-task" in out
    settle(worker, backend, queues, 30)
    assert len(worker.received) == 30
    assert count(backend.endpoint_url, queues.dlq_url) == 30


def test_an_empty_dlq_moves_nothing(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "redrive", "--yes"]) == 0
    assert "moved 0 of 0" in capsys.readouterr().out


class DeadLetteringAgain(Progress):
    """A progress line that, at each update of the redrive, plays a worker failing every job at once: it receives
    what the redrive copied to the source so far and dead-letters it again (a new DLQ message naming its source
    message as ``original_message_id``). No thread: each update finishes its dead-letters before the next receive."""

    def __init__(self, endpoint_url: str, queues: Created) -> None:
        super().__init__(io.StringIO(), None)
        self.client = sqs_client(endpoint_url)
        self.queues = queues
        self.received: list[str] = []  # source MessageIds, in order

    def update(self, done: int, failed: int = 0) -> None:
        for _ in range(20):  # bounded: the copies are in the source already, visible
            if len(self.received) >= done:
                return
            response = self.client.receive_message(QueueUrl=self.queues.queue_url, MaxNumberOfMessages=10)
            self.received.extend(dead_letter_again(self.client, self.queues, response.get("Messages", [])))


def test_a_copy_dead_lettered_again_never_moves_twice(backend: Backend, queues: Created) -> None:
    """The snapshot counted 5, but 2 left the DLQ another way before the redrive reached them: the count has room
    for 2 more when the 3 moved ones come back dead-lettered again, and they stay (moved 3 of 5, each once)."""
    client = sqs_client(backend.endpoint_url)
    for _ in range(5):
        dead_letter(backend.endpoint_url, queues.dlq_url, BODY, category="bug", error="TypeError: boom")
    dlq = DeadLetterQueue(client, dlq_url=queues.dlq_url, source_url=queues.queue_url)
    snapshot = dlq.snapshot()
    assert snapshot.count == 5
    taken = client.receive_message(QueueUrl=queues.dlq_url, MaxNumberOfMessages=2, VisibilityTimeout=60)["Messages"]
    for message in taken:  # another operator's `dlq requeue` or delete, say
        client.delete_message(QueueUrl=queues.dlq_url, ReceiptHandle=message["ReceiptHandle"])
    worker = DeadLetteringAgain(backend.endpoint_url, queues)
    result = redrive_by_receiving(dlq, limiter=RateLimiter(None), snapshot=snapshot, progress=worker)
    assert (result.moved, result.total, result.failed) == (3, 5, [])
    assert len(worker.received) == 3  # each of the 3 reached the source once
    assert count(backend.endpoint_url, queues.dlq_url) == 3  # dead-lettered again, they wait for the next redrive
    assert count(backend.endpoint_url, queues.queue_url) == 0


# ------------------------------------------------------------------------------------------------ pure


def letter(message_id: str, *, sent_ms: int | None, original: str | None = None) -> DeadLetter:
    attributes = {"original_message_id": {"DataType": "String", "StringValue": original}} if original else {}
    system = {"SentTimestamp": str(sent_ms)} if sent_ms is not None else {}
    return DeadLetter(message_id=message_id, receipt_handle="rh", body="b", attributes=attributes, system=system)


@pytest.mark.parametrize(
    ("candidate", "moved", "admitted"),
    [
        (letter("d1", sent_ms=999), set(), True),  # in the DLQ before the start
        (letter("d1", sent_ms=1000), set(), True),  # the start's own millisecond
        (letter("d1", sent_ms=1001), set(), False),  # dead-lettered during the run
        (letter("d1", sent_ms=None), set(), True),  # no timestamp: lineage and count decide
        (letter("d1", sent_ms=999), {"d1"}, False),  # moved already (a stale receive)
        (letter("d2", sent_ms=999, original="s1"), {"d1", "s1"}, False),  # our copy s1, dead-lettered again
        (letter("s1", sent_ms=999), {"d1", "s1"}, False),  # our copy moved back by SQS's redrive policy
        (letter("d3", sent_ms=999, original="other"), {"d1", "s1"}, True),
    ],
)
def test_snapshot_admits(candidate: DeadLetter, moved: set[str], admitted: bool) -> None:
    assert Snapshot(count=5, sent_until_ms=1000).admits(candidate, moved=moved) is admitted


@pytest.mark.parametrize(
    ("remaining", "rate", "expected"),
    [(0, 10, 0.02), (1, 500, 0.02), (10, 10, 0.5), (100, 10, 1.0), (-3, 10, 0.02), (4, 4, 0.5)],
)
def test_move_task_poll_s(remaining: int, rate: int, expected: float) -> None:
    assert move_task_poll_s(remaining=remaining, rate_per_s=rate) == pytest.approx(expected)
    with pytest.raises(ValueError, match="rate_per_s"):
        move_task_poll_s(remaining=1, rate_per_s=0)
