"""Dead-letter tooling: read, group, show, redrive, requeue and purge the dead-letter queue (boto3, blocking).

Rules every operation keeps:

- Send before delete: a DLQ message is deleted only after the send that copies it elsewhere succeeded, checked
  per entry (the ``Failed`` list of ``SendMessageBatch``); nothing leaves the DLQ without landing elsewhere.
- Reading a DLQ means receiving: messages are held with a short visibility timeout while read and released
  (visibility 0) afterwards. Each read adds one to their ``ApproximateReceiveCount``.
- A redrive moves at most the messages that were in the DLQ when it started (its snapshot: the count SQS
  reports and the start time), each at most once: messages dead-lettered again during the run stay.
- Bodies are copied byte for byte. The dead-letter attributes (``error_category``, ``error_message``,
  ``attempts``, ``failed_at``, ``source_queue``, ``original_message_id``) are stripped from a redriven
  message; other attributes are kept.

The pure parts live apart: records, grouping and attribute rules in ``worker.ops.dlq_records``, rate limiting and
progress text in ``worker.ops.progress``.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import describe, resolve_queue_url_sync, translate
from worker.errors import QueueUnavailable, WorkerError
from worker.names import default_dlq_name, parse_redrive_policy, queue_name_of
from worker.ops.dlq_records import DeadLetter, Snapshot, move_task_poll_s, redrive_attributes, requeue_attributes
from worker.ops.progress import Progress, RateLimiter

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import SendMessageBatchRequestEntryTypeDef

log = logging.getLogger("worker.dlq")

BATCH_SIZE = 10
#: Bytes of bodies per SendMessageBatch (the emulators' and older AWS limit for a whole batch: 256 KiB).
BATCH_BYTES = 256 * 1024
#: How long a message stays hidden while a command reads it, before it is released.
READ_VISIBILITY_S = 120
#: StartMessageMoveTask accepts 1..500 messages per second.
MOVE_TASK_MAX_RATE = 500
UNSUPPORTED_CODES = frozenset(
    {"UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", "InternalFailure", "InternalError"}
)
#: A redrive stops after this many receives in a row bring nothing it may move (only newer dead letters).
IDLE_RECEIVES = 3


def queue_attributes(sqs: SQSClient, url: str, names: Sequence[str]) -> dict[str, str]:
    try:
        response = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(names))  # type: ignore[arg-type]
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, "GetQueueAttributes", resource=queue_name_of(url), endpoint=sqs.meta.endpoint_url) from exc
    return {str(k): str(v) for k, v in response.get("Attributes", {}).items()}


def resolve_dlq_url(sqs: SQSClient, source_url: str, dead_letter_queue: str | None) -> str:
    """WORKER_DEAD_LETTER_QUEUE, else the source queue's redrive target, else ``<queue>-dlq``."""
    if dead_letter_queue:
        return resolve_queue_url_sync(sqs, dead_letter_queue)
    target, _ = parse_redrive_policy(queue_attributes(sqs, source_url, ["RedrivePolicy"]).get("RedrivePolicy"))
    return resolve_queue_url_sync(sqs, target or default_dlq_name(queue_name_of(source_url)))


class DeadLetterQueue:
    """The DLQ of one source queue, through a blocking boto3 SQS client."""

    def __init__(self, sqs: SQSClient, *, dlq_url: str, source_url: str) -> None:
        self.sqs = sqs
        self.dlq_url = dlq_url
        self.source_url = source_url
        self.source_fifo = source_url.endswith(".fifo")
        self._deleted: set[str] = set()

    # -- reading

    def approximate_count(self) -> int | None:
        attrs = queue_attributes(self.sqs, self.dlq_url, ["ApproximateNumberOfMessages"])
        value = attrs.get("ApproximateNumberOfMessages")
        return int(value) if value is not None else None

    def approximate_counts(self) -> tuple[int | None, int | None]:
        """(visible, in flight): in flight are letters someone else received and has not released yet."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attrs = queue_attributes(self.sqs, self.dlq_url, names)
        visible, hidden = (attrs.get(name) for name in names)
        return (int(visible) if visible is not None else None, int(hidden) if hidden is not None else None)

    def snapshot(self) -> Snapshot:
        """What a redrive starting now may move: the count SQS reports, and now on the endpoint's clock."""
        try:
            response = self.sqs.get_queue_attributes(
                QueueUrl=self.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
            )
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, "GetQueueAttributes", resource=queue_name_of(self.dlq_url)) from exc
        count = int(response.get("Attributes", {}).get("ApproximateNumberOfMessages", 0))
        return Snapshot(count=count, sent_until_ms=_endpoint_now_ms(response))

    def _receive(self, *, max_messages: int, visibility_s: int, wait_s: int) -> list[DeadLetter]:
        try:
            response = self.sqs.receive_message(
                QueueUrl=self.dlq_url,
                MaxNumberOfMessages=max(1, min(BATCH_SIZE, max_messages)),
                VisibilityTimeout=visibility_s,
                WaitTimeSeconds=wait_s,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
            )
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, "ReceiveMessage", resource=queue_name_of(self.dlq_url)) from exc
        return [DeadLetter.from_message(m) for m in response.get("Messages", [])]

    @contextlib.contextmanager
    def held(self, *, limit: int, visibility_s: int = READ_VISIBILITY_S, wait_s: int = 1) -> Iterator[list[DeadLetter]]:
        """Receive up to ``limit`` messages and keep them hidden while the caller works with them.

        On exit, every message the caller did not delete (see :meth:`forget`) is released (visibility 0).
        Stops at the first receive that returns nothing new (an emptied or fully held queue).
        """
        seen: dict[str, DeadLetter] = {}
        self._deleted = set()
        try:
            while len(seen) < limit:
                batch = self._receive(max_messages=limit - len(seen), visibility_s=visibility_s, wait_s=wait_s)
                fresh = [letter for letter in batch if letter.message_id not in seen]
                for letter in batch:  # a message seen again (held longer than visibility_s): newest handle
                    seen[letter.message_id] = letter
                if not fresh:
                    break
            yield list(seen.values())
        finally:
            self.release([letter for letter in seen.values() if letter.message_id not in self._deleted])

    def forget(self, message_ids: Iterable[str]) -> None:
        """Mark messages as deleted: :meth:`held` will not release them."""
        self._deleted.update(message_ids)

    def release(self, letters: Sequence[DeadLetter]) -> None:
        """Make messages visible again at once (best effort: they reappear by themselves after the timeout)."""
        for start in range(0, len(letters), BATCH_SIZE):
            chunk = letters[start : start + BATCH_SIZE]
            entries = [
                {"Id": str(i), "ReceiptHandle": letter.receipt_handle, "VisibilityTimeout": 0}
                for i, letter in enumerate(chunk)
            ]
            try:
                self.sqs.change_message_visibility_batch(QueueUrl=self.dlq_url, Entries=entries)  # type: ignore[arg-type]
            except (BotoCoreError, ClientError) as exc:
                log.warning(
                    "could not release %d DLQ messages (they reappear by themselves): %s", len(chunk), describe(exc)
                )

    def read(self, *, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` messages, released again after reading."""
        with self.held(limit=limit) as letters:
            return letters

    def find(self, ident: str, *, limit: int) -> DeadLetter | None:
        """The message whose DLQ MessageId or original_message_id is ``ident`` (reads up to ``limit``)."""
        with self.held(limit=limit) as letters:
            for letter in letters:
                if letter.matches(ident):
                    return letter
        return None

    # -- moving

    def _send_entries(
        self, letters: Sequence[DeadLetter], attributes: Sequence[dict[str, Any]], suffix: str
    ) -> list[SendMessageBatchRequestEntryTypeDef]:
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        for index, (letter, attrs) in enumerate(zip(letters, attributes, strict=True)):
            entry: SendMessageBatchRequestEntryTypeDef = {"Id": str(index), "MessageBody": letter.body}
            if attrs:
                entry["MessageAttributes"] = attrs
            if self.source_fifo:
                entry["MessageGroupId"] = letter.system.get("MessageGroupId") or "default"
                entry["MessageDeduplicationId"] = (letter.message_id + suffix)[:128]
            entries.append(entry)
        return entries

    def copy_to_source(
        self, letters: Sequence[DeadLetter], attributes: Sequence[dict[str, Any]], *, suffix: str
    ) -> tuple[list[tuple[DeadLetter, str]], list[tuple[DeadLetter, str]]]:
        """Send copies to the source queue; ``(sent, failed)`` with the new message id or the failure reason."""
        sent: list[tuple[DeadLetter, str]] = []
        failed: list[tuple[DeadLetter, str]] = []
        for chunk in _byte_batches(list(zip(letters, attributes, strict=True))):
            chunk_letters = [letter for letter, _ in chunk]
            entries = self._send_entries(chunk_letters, [attrs for _, attrs in chunk], suffix)
            try:
                response = self.sqs.send_message_batch(QueueUrl=self.source_url, Entries=entries)
            except (BotoCoreError, ClientError) as exc:
                failed.extend((letter, f"SendMessageBatch failed: {describe(exc)}") for letter in chunk_letters)
                continue
            for item in response.get("Successful", []):
                sent.append((chunk_letters[int(item["Id"])], item["MessageId"]))
            for error in response.get("Failed", []):
                reason = f"{error.get('Code', 'Unknown')}: {error.get('Message', '')}"
                failed.append((chunk_letters[int(error["Id"])], reason))
        return sent, failed

    def delete(self, letters: Sequence[DeadLetter]) -> list[tuple[DeadLetter, str]]:
        """Delete from the DLQ (only messages already copied elsewhere); the ones that failed, with why."""
        failed: list[tuple[DeadLetter, str]] = []
        for start in range(0, len(letters), BATCH_SIZE):
            chunk = letters[start : start + BATCH_SIZE]
            entries = [{"Id": str(i), "ReceiptHandle": letter.receipt_handle} for i, letter in enumerate(chunk)]
            try:
                response = self.sqs.delete_message_batch(QueueUrl=self.dlq_url, Entries=entries)  # type: ignore[arg-type]
            except (BotoCoreError, ClientError) as exc:
                failed.extend((letter, f"DeleteMessageBatch failed: {describe(exc)}") for letter in chunk)
                continue
            for item in response.get("Failed", []):
                failed.append((chunk[int(item["Id"])], f"{item.get('Code', 'Unknown')}: {item.get('Message', '')}"))
        self.forget({letter.message_id for letter in letters} - {letter.message_id for letter, _ in failed})
        return failed

    def purge(self) -> None:
        try:
            self.sqs.purge_queue(QueueUrl=self.dlq_url)
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, "PurgeQueue", resource=queue_name_of(self.dlq_url)) from exc


def _byte_batches(items: list[tuple[DeadLetter, dict[str, Any]]]) -> Iterator[list[tuple[DeadLetter, dict[str, Any]]]]:
    batch: list[tuple[DeadLetter, dict[str, Any]]] = []
    size = 0
    for item in items:
        item_size = len(item[0].body.encode("utf-8")) + len(json.dumps(item[1]))
        if batch and (len(batch) >= BATCH_SIZE or size + item_size > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item_size
    if batch:
        yield batch


@dataclass
class MoveResult:
    """What a redrive or requeue did."""

    method: str  # "move-task", "receive-send-delete" or "requeue"
    moved: int = 0
    total: int | None = None  # how many it set out to move (a redrive: the DLQ's count at its start)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (message id, reason)
    new_message_ids: list[tuple[str, str]] = field(default_factory=list)  # (dlq message id, new id)

    @property
    def ok(self) -> bool:
        return not self.failed


def redrive_by_receiving(
    dlq: DeadLetterQueue,
    *,
    limiter: RateLimiter,
    snapshot: Snapshot,
    progress: Progress | None = None,
    limit: int | None = None,
) -> MoveResult:
    """Move the messages of ``snapshot`` (those in the DLQ when the redrive started) to the source: receive 10,
    send the ones it admits, delete the ones sent. Messages dead-lettered during the run (sent after its start,
    or copies of a message it moved) are held until the end and stay in the DLQ; no message moves twice.

    Stops when the snapshot's count was moved or failed, at ``limit``, when the DLQ answers empty, after
    IDLE_RECEIVES receives in a row without a message to move, or when a whole batch fails.
    """
    target = snapshot.count if limit is None else min(limit, snapshot.count)
    result = MoveResult("receive-send-delete", total=target)
    kept: list[DeadLetter] = []  # held until the end, then released: failures and messages not to move
    seen: set[str] = set()
    moved_ids: set[str] = set()
    idle = 0
    try:
        while result.moved + len(result.failed) < target and idle < IDLE_RECEIVES:
            received = dlq._receive(max_messages=BATCH_SIZE, visibility_s=READ_VISIBILITY_S, wait_s=1)
            if not received:
                break
            fresh = [letter for letter in received if letter.message_id not in seen]
            seen.update(letter.message_id for letter in fresh)
            room = target - result.moved - len(result.failed)
            batch = [letter for letter in fresh if snapshot.admits(letter, moved=moved_ids)][:room]
            chosen = {letter.message_id for letter in batch}
            kept.extend(letter for letter in fresh if letter.message_id not in chosen)
            if not batch:
                idle += 1
                continue
            idle = 0
            limiter.acquire(len(batch))
            sent, failed = dlq.copy_to_source(batch, [redrive_attributes(letter) for letter in batch], suffix="")
            for letter, new_id in sent:
                moved_ids.update((letter.message_id, new_id))
            delete_failures = dlq.delete([letter for letter, _ in sent])
            result.moved += len(sent) - len(delete_failures)
            for letter, reason in delete_failures:
                # Sent but still in the DLQ: a duplicate, never a loss. Say so.
                result.failed.append(
                    (letter.message_id, f"copied to the source but not deleted from the DLQ: {reason}")
                )
            for letter, reason in failed:
                kept.append(letter)
                result.failed.append((letter.message_id, reason))
            if progress is not None:
                progress.update(result.moved, len(result.failed))
            if not sent:
                break
    finally:
        dlq.release(kept)
    return result


def requeue(dlq: DeadLetterQueue, letters: Sequence[DeadLetter], *, by: str, reason: str, at: datetime) -> MoveResult:
    """Send each letter to the source as a fresh message with an audit trail, then delete it from the DLQ.

    Each requeue is logged (logger ``worker.dlq``, event ``requeued``) with who, why and both message ids.
    """
    result = MoveResult("requeue", total=len(letters))
    ready: list[DeadLetter] = []
    attributes: list[dict[str, Any]] = []
    for letter in letters:
        try:
            attributes.append(requeue_attributes(letter, by=by, at=at, reason=reason))
        except WorkerError as exc:
            result.failed.append((letter.message_id, str(exc)))
            continue
        ready.append(letter)
    suffix = f"-requeued-{int(at.timestamp() * 1000)}"
    sent, failed = dlq.copy_to_source(ready, attributes, suffix=suffix)
    result.failed.extend((letter.message_id, why) for letter, why in failed)
    delete_failures = {letter.message_id: why for letter, why in dlq.delete([letter for letter, _ in sent])}
    for letter, new_id in sent:
        result.new_message_ids.append((letter.message_id, new_id))
        problem = delete_failures.get(letter.message_id)
        if problem is not None:
            result.failed.append((letter.message_id, f"requeued as {new_id} but not deleted from the DLQ: {problem}"))
        else:
            result.moved += 1
        log.info(
            "dead letter requeued",
            extra={
                "event": "requeued",
                "dlq_message_id": letter.message_id,
                "original_message_id": letter.original_message_id,
                "new_message_id": new_id,
                "category": letter.category,
                "requeued_by": by,
                "requeue_reason": reason,
                "deleted_from_dlq": problem is None,
            },
        )
    return result


def _is_unsupported(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status >= 500 or error.get("Code", "") in UNSUPPORTED_CODES


def _endpoint_now_ms(response: Any) -> int:
    """The end of the second the response's ``Date`` header names (the endpoint's clock), else the local clock."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        with contextlib.suppress(TypeError, ValueError):
            return int(parsedate_to_datetime(date).timestamp()) * 1000 + 999
    return int(time.time() * 1000)


def queue_arn(sqs: SQSClient, url: str) -> str:
    return queue_attributes(sqs, url, ["QueueArn"])["QueueArn"]


def start_move_task(sqs: SQSClient, *, dlq_arn: str, source_arn: str, rate_per_s: int) -> str | None:
    """Start a StartMessageMoveTask from the DLQ to the source at ``rate_per_s`` (1..500); None when the endpoint
    does not support it."""
    rate = max(1, min(MOVE_TASK_MAX_RATE, rate_per_s))
    try:
        response = sqs.start_message_move_task(
            SourceArn=dlq_arn, DestinationArn=source_arn, MaxNumberOfMessagesPerSecond=rate
        )
    except ClientError as exc:
        if _is_unsupported(exc):
            log.debug("StartMessageMoveTask is not supported here (%s); moving by receive, send, delete", describe(exc))
            return None
        raise translate(exc, "StartMessageMoveTask", resource=dlq_arn.rsplit(":", 1)[-1]) from exc
    except BotoCoreError as exc:
        raise translate(exc, "StartMessageMoveTask", resource=dlq_arn.rsplit(":", 1)[-1]) from exc
    handle: str = response["TaskHandle"]
    return handle


TERMINAL_TASK_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


def _task(sqs: SQSClient, dlq_arn: str, task_handle: str) -> Any:
    try:
        tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10).get("Results", [])
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, "ListMessageMoveTasks", resource=dlq_arn.rsplit(":", 1)[-1]) from exc
    task = next((t for t in tasks if t.get("TaskHandle") == task_handle), tasks[0] if tasks else None)
    if task is None:
        raise QueueUnavailable(f"move task {task_handle} is not listed")
    return task


def wait_move_task(
    sqs: SQSClient,
    *,
    dlq_arn: str,
    task_handle: str,
    snapshot: Snapshot,
    rate_per_s: int,
    progress: Progress | None = None,
    timeout_s: float = 3600.0,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> MoveResult:
    """Follow a move task until it ends, or until it moved the messages that were in the DLQ when it started
    (the snapshot's count, or the task's ApproximateNumberOfMessagesToMove when smaller): then cancel it, so
    messages dead-lettered again during the run stay in the DLQ. After ``timeout_s`` the task goes on in SQS;
    its handle is reported."""
    result = MoveResult("move-task", total=snapshot.count)
    deadline = monotonic() + timeout_s
    while True:
        task = _task(sqs, dlq_arn, task_handle)
        result.moved = int(task.get("ApproximateNumberOfMessagesMoved", 0))
        if task.get("ApproximateNumberOfMessagesToMove") is not None:
            result.total = min(snapshot.count, int(task["ApproximateNumberOfMessagesToMove"]))
        if progress is not None:
            progress.total = result.total
            progress.update(result.moved)
        status = task.get("Status", "")
        total = result.total or 0
        if status == "RUNNING" and result.moved >= total:
            return _cancel_move_task(sqs, dlq_arn=dlq_arn, task_handle=task_handle, result=result)
        if status in TERMINAL_TASK_STATES:
            if status != "COMPLETED":
                result.failed.append(("(move task)", f"{status}: {task.get('FailureReason', 'no reason given')}"))
            return result
        if monotonic() >= deadline:
            result.failed.append(("(move task)", f"still {status} after {timeout_s:g} s; task handle {task_handle}"))
            return result
        sleep(move_task_poll_s(remaining=total - result.moved, rate_per_s=rate_per_s))


def _cancel_move_task(sqs: SQSClient, *, dlq_arn: str, task_handle: str, result: MoveResult) -> MoveResult:
    """Cancel a task that moved its snapshot; the moved count is what SQS reports after the cancel."""
    response: Any = {}
    try:
        response = sqs.cancel_message_move_task(TaskHandle=task_handle)
    except ClientError as exc:
        # It ended between the look and the cancel: nothing is left to stop.
        log.info("move task %s not cancelled (%s)", task_handle, describe(exc))
    except BotoCoreError as exc:
        raise translate(exc, "CancelMessageMoveTask", resource=dlq_arn.rsplit(":", 1)[-1]) from exc
    moved = response.get("ApproximateNumberOfMessagesMoved")
    if moved is not None:
        result.moved = int(moved)
    return result


def redrive(
    dlq: DeadLetterQueue,
    snapshot: Snapshot,
    *,
    rate_per_s: int | None = None,
    move_task: bool = True,
    limit: int | None = None,
    progress: Progress | None = None,
    move_task_timeout_s: float = 3600.0,
    on_receiving: Callable[[], None] | None = None,
) -> MoveResult:
    """Move the messages of ``snapshot`` back to the source queue (``dlq redrive`` and the dashboard's "Redrive
    all"): by a move task where ``move_task``, no ``limit`` and the endpoint has StartMessageMoveTask (at
    ``rate_per_s``, at most MOVE_TASK_MAX_RATE), else by receive, send, delete (at ``rate_per_s``, unbounded when
    None). ``on_receiving`` is called when the endpoint has no move task and the redrive falls back to receiving;
    ``progress`` gets the updates and the final line."""
    if snapshot.count == 0:
        return MoveResult("nothing to move", total=0)
    if move_task and limit is None:
        rate = min(rate_per_s or MOVE_TASK_MAX_RATE, MOVE_TASK_MAX_RATE)
        dlq_arn = queue_arn(dlq.sqs, dlq.dlq_url)
        handle = start_move_task(
            dlq.sqs, dlq_arn=dlq_arn, source_arn=queue_arn(dlq.sqs, dlq.source_url), rate_per_s=rate
        )
        if handle is not None:
            result = wait_move_task(
                dlq.sqs,
                dlq_arn=dlq_arn,
                task_handle=handle,
                snapshot=snapshot,
                rate_per_s=rate,
                progress=progress,
                timeout_s=move_task_timeout_s,
            )
            if progress is not None:
                progress.finish(result.moved)
            return result
        if on_receiving is not None:
            on_receiving()
    result = redrive_by_receiving(
        dlq, limiter=RateLimiter(rate_per_s), snapshot=snapshot, progress=progress, limit=limit
    )
    if progress is not None:
        progress.finish(result.moved, len(result.failed))
    return result


def now_utc() -> datetime:
    return datetime.now(UTC)


def requeued_by(explicit: str | None) -> str:
    """Who a requeue is recorded as: ``--by``, else the login name, else "unknown"."""
    if explicit:
        return explicit
    try:
        return getpass.getuser()  # LOGNAME, USER, LNAME, USERNAME, then the password database
    except (KeyError, OSError):
        return "unknown"
