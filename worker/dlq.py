"""Dead-letter tooling: read, group, show, redrive, requeue and purge the dead-letter queue (boto3, blocking).

Rules every operation keeps:

- Send before delete: a DLQ message is deleted only after the send that copies it elsewhere succeeded, checked
  per entry (the ``Failed`` list of ``SendMessageBatch``); nothing leaves the DLQ without landing elsewhere.
- Reading a DLQ means receiving: messages are held with a short visibility timeout while read and released
  (visibility 0) afterwards. Each read adds one to their ``ApproximateReceiveCount``.
- Bodies are copied byte for byte. The dead-letter attributes (``error_category``, ``error_message``,
  ``attempts``, ``failed_at``, ``source_queue``, ``original_message_id``) are stripped from a redriven
  message; other attributes are kept.

The pure parts live apart: records, grouping and attribute rules in ``worker.dlq_records``, rate limiting and
progress text in ``worker.progress``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.dlq_records import DeadLetter, redrive_attributes, requeue_attributes
from worker.errors import ConfigError, QueueUnavailable, WorkerError
from worker.names import default_dlq_name, queue_name_of
from worker.progress import Progress, RateLimiter

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


def translate(exc: Exception, action: str) -> WorkerError:
    """A WorkerError for a botocore failure (ConfigError for a missing queue or access, else QueueUnavailable)."""
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "")
        if "NonExistentQueue" in code or code == "QueueDoesNotExist":
            return ConfigError(f"{action}: the queue does not exist ({message or code})")
        if code in ("AccessDenied", "AccessDeniedException", "InvalidClientTokenId", "UnrecognizedClientException"):
            return ConfigError(f"{action}: access denied ({message or code})")
        return QueueUnavailable(f"{action} failed: {code}: {message}")
    return QueueUnavailable(f"{action} failed: {exc}")


def resolve_queue_url(sqs: SQSClient, queue: str) -> str:
    """A queue URL from a name or URL."""
    if queue.startswith(("https://", "http://")):
        return queue
    try:
        return sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, f"GetQueueUrl({queue})") from exc


def queue_attributes(sqs: SQSClient, url: str, names: Sequence[str]) -> dict[str, str]:
    try:
        response = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(names))  # type: ignore[arg-type]
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, f"GetQueueAttributes({queue_name_of(url)})") from exc
    return {str(k): str(v) for k, v in response.get("Attributes", {}).items()}


def resolve_dlq_url(sqs: SQSClient, source_url: str, dead_letter_queue: str | None) -> str:
    """WORKER_DEAD_LETTER_QUEUE, else the source queue's redrive target, else ``<queue>-dlq``."""
    if dead_letter_queue:
        return resolve_queue_url(sqs, dead_letter_queue)
    policy = queue_attributes(sqs, source_url, ["RedrivePolicy"]).get("RedrivePolicy")
    if policy:
        try:
            target = json.loads(policy).get("deadLetterTargetArn", "")
        except ValueError:
            target = ""
        if target:
            return resolve_queue_url(sqs, queue_name_of(target))
    return resolve_queue_url(sqs, default_dlq_name(queue_name_of(source_url)))


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
            raise translate(exc, "ReceiveMessage(DLQ)") from exc
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
                log.warning("could not release %d DLQ messages (they reappear by themselves): %s", len(chunk), exc)

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
                failed.extend((letter, f"SendMessageBatch failed: {exc}") for letter in chunk_letters)
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
                failed.extend((letter, f"DeleteMessageBatch failed: {exc}") for letter in chunk)
                continue
            for item in response.get("Failed", []):
                failed.append((chunk[int(item["Id"])], f"{item.get('Code', 'Unknown')}: {item.get('Message', '')}"))
        self.forget({letter.message_id for letter in letters} - {letter.message_id for letter, _ in failed})
        return failed

    def purge(self) -> None:
        try:
            self.sqs.purge_queue(QueueUrl=self.dlq_url)
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, "PurgeQueue(DLQ)") from exc


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

    method: str  # "move-task" or "receive-send-delete"
    moved: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (message id, reason)
    new_message_ids: list[tuple[str, str]] = field(default_factory=list)  # (dlq message id, new id)

    @property
    def ok(self) -> bool:
        return not self.failed


def redrive_by_receiving(
    dlq: DeadLetterQueue,
    *,
    limiter: RateLimiter,
    progress: Progress | None = None,
    limit: int | None = None,
) -> MoveResult:
    """Move every DLQ message to the source: receive 10, send 10, delete the ones sent. Stops when the DLQ
    answers empty, at ``limit``, or when a whole batch fails (the source is unreachable or refuses)."""
    result = MoveResult("receive-send-delete")
    held_failures: list[DeadLetter] = []
    failed_ids: set[str] = set()
    try:
        while limit is None or result.moved < limit:
            want = BATCH_SIZE if limit is None else min(BATCH_SIZE, limit - result.moved)
            batch = [
                letter
                for letter in dlq._receive(max_messages=want, visibility_s=READ_VISIBILITY_S, wait_s=1)
                if letter.message_id not in failed_ids
            ]
            if not batch:
                break
            limiter.acquire(len(batch))
            sent, failed = dlq.copy_to_source(batch, [redrive_attributes(letter) for letter in batch], suffix="")
            delete_failures = dlq.delete([letter for letter, _ in sent])
            result.moved += len(sent) - len(delete_failures)
            for letter, reason in delete_failures:
                # Sent but still in the DLQ: a duplicate, never a loss. Say so.
                result.failed.append(
                    (letter.message_id, f"copied to the source but not deleted from the DLQ: {reason}")
                )
            for letter, reason in failed:
                failed_ids.add(letter.message_id)
                held_failures.append(letter)
                result.failed.append((letter.message_id, reason))
            if progress is not None:
                progress.update(result.moved, len(result.failed))
            if batch and not sent:
                break
    finally:
        dlq.release(held_failures)
    return result


def requeue(dlq: DeadLetterQueue, letters: Sequence[DeadLetter], *, by: str, reason: str, at: datetime) -> MoveResult:
    """Send each letter to the source as a fresh message with an audit trail, then delete it from the DLQ.

    Each requeue is logged (logger ``worker.dlq``, event ``requeued``) with who, why and both message ids.
    """
    result = MoveResult("requeue")
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


def queue_arn(sqs: SQSClient, url: str) -> str:
    return queue_attributes(sqs, url, ["QueueArn"])["QueueArn"]


def start_move_task(sqs: SQSClient, *, dlq_arn: str, source_arn: str, rate_per_s: int | None) -> str | None:
    """Start a StartMessageMoveTask from the DLQ to the source; None when the endpoint does not support it."""
    params: dict[str, Any] = {"SourceArn": dlq_arn, "DestinationArn": source_arn}
    if rate_per_s is not None:
        params["MaxNumberOfMessagesPerSecond"] = max(1, min(MOVE_TASK_MAX_RATE, rate_per_s))
    try:
        response = sqs.start_message_move_task(**params)
    except ClientError as exc:
        if _is_unsupported(exc):
            log.info("StartMessageMoveTask is not supported here (%s); moving by receive, send, delete", exc)
            return None
        raise translate(exc, "StartMessageMoveTask") from exc
    except BotoCoreError as exc:
        raise translate(exc, "StartMessageMoveTask") from exc
    handle: str = response["TaskHandle"]
    return handle


TERMINAL_TASK_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


def wait_move_task(
    sqs: SQSClient,
    *,
    dlq_arn: str,
    task_handle: str,
    progress: Progress | None = None,
    poll_s: float = 1.0,
    timeout_s: float = 3600.0,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> MoveResult:
    """Follow a move task until it ends (or ``timeout_s``: the task goes on in SQS; its handle is logged)."""
    result = MoveResult("move-task")
    deadline = monotonic() + timeout_s
    while True:
        try:
            tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10).get("Results", [])
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, "ListMessageMoveTasks") from exc
        task = next((t for t in tasks if t.get("TaskHandle") == task_handle), tasks[0] if tasks else None)
        if task is None:
            raise QueueUnavailable(f"move task {task_handle} is not listed")
        result.moved = int(task.get("ApproximateNumberOfMessagesMoved", 0))
        total = task.get("ApproximateNumberOfMessagesToMove")
        if progress is not None:
            if progress.total is None and total is not None:
                progress.total = int(total)
            progress.update(result.moved)
        status = task.get("Status", "")
        if status in TERMINAL_TASK_STATES:
            if status != "COMPLETED":
                result.failed.append(("(move task)", f"{status}: {task.get('FailureReason', 'no reason given')}"))
            return result
        if monotonic() >= deadline:
            result.failed.append(("(move task)", f"still {status} after {timeout_s:g} s; task handle {task_handle}"))
            return result
        sleep(poll_s)


def now_utc() -> datetime:
    return datetime.now(UTC)


def sqs_client(*, max_attempts: int = 3) -> SQSClient:
    """A blocking SQS client for the commands: region from AWS_REGION, endpoint from AWS_ENDPOINT_URL."""
    import boto3
    from botocore.config import Config

    from worker.settings import aws_region

    config = Config(
        connect_timeout=5, read_timeout=30, retries={"mode": "standard", "total_max_attempts": max_attempts}
    )
    client: SQSClient = boto3.client("sqs", region_name=aws_region(), config=config)
    return client
