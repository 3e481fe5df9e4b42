"""An in-memory SQS: queues that keep the semantics the worker relies on, for tests and ``worker.testing``.

:class:`MemoryBroker` holds queues that share one lock and one :class:`MemoryClock`; :class:`MemoryQueue` is one
of them as a :class:`~worker.backends.protocols.MessageQueue` (what the runtime talks to). Kept as SQS has it:

- a receive hides a message for its visibility timeout and counts it (``ApproximateReceiveCount``); a delete
  needs the latest receipt handle (an older one succeeds without deleting, as on SQS); a visibility change needs
  the message in flight under that handle, else the entry fails (``EntryFailed``, as a batch entry would);
- ``DelaySeconds`` (0-900, standard queues only), long polling that returns when a message becomes visible;
- a redrive policy: a message received ``max_receive_count`` times moves to the dead-letter queue on its next
  receive (same MessageId, body and attributes);
- FIFO queues: order within a message group, and no message of a group is delivered while an earlier one is in
  flight or delayed; ``MessageGroupId`` required; deduplication by ``MessageDeduplicationId`` (or content, when
  the queue says so) for 5 minutes;
- ``MaximumMessageSize`` (body plus attributes, counted as SQS counts them), at most 10 message attributes, no
  empty attribute values and only the characters SQS accepts: a send that breaks one is refused as SQS refuses it
  (``QueueUnavailable`` whose cause is the ClientError SQS would answer, so ``content_refused`` reads it alike).

The clock runs with real time plus whatever was skipped: :meth:`MemoryBroker.advance_to_next_due` moves it to the
moment the next invisible or delayed message becomes visible, so retry delays pass at once in a test.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from worker.backends.aws import translate
from worker.backends.batching import EntryFailed
from worker.backends.protocols import Message
from worker.deadletter import MAX_MESSAGE_ATTRIBUTES, SQS_MAX_MESSAGE_BYTES, message_bytes
from worker.errors import ConfigError
from worker.policy import visibility_cap_s

#: SQS caps DelaySeconds at 15 minutes and a visibility timeout at 12 hours.
MAX_DELAY_S = 900
MAX_VISIBILITY_TIMEOUT_S = 43_200
#: FIFO deduplication window.
DEDUPLICATION_WINDOW_S = 300
_REFUSED_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class MemoryClock:
    """Seconds that run with real time, plus whatever was skipped (``advance``)."""

    def __init__(self) -> None:
        self.skipped_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped_s

    def time(self) -> float:
        return time.time() + self.skipped_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock only moves ahead")
        self.skipped_s += seconds


@dataclass
class StoredMessage:
    """A message as the queue holds it. ``visible_at`` is on the broker's monotonic clock."""

    message_id: str
    body: str
    message_attributes: dict[str, Any]
    sent_at_ms: int
    visible_at: float
    group_id: str | None = None
    deduplication_id: str | None = None
    sequence_number: int | None = None
    receive_count: int = 0
    receipt_handle: str | None = None
    received_at: float | None = None
    first_receive_ms: int | None = None
    #: Received and not given a visibility since: a consumer may be about to take it up.
    claimed: bool = False

    @property
    def attribute_values(self) -> dict[str, str]:
        """The message attributes' string values, by name (what a test usually wants to read)."""
        return {name: str(value.get("StringValue", "")) for name, value in self.message_attributes.items()}


@dataclass(frozen=True)
class QueueCounts:
    """A queue's messages by state, as SQS's Approximate* attributes count them (exact here)."""

    visible: int
    in_flight: int
    delayed: int

    @property
    def total(self) -> int:
        return self.visible + self.in_flight + self.delayed


@dataclass
class _QueueState:
    name: str
    visibility_timeout_s: int
    delay_s: int
    maximum_message_bytes: int
    dead_letter_queue: str | None
    max_receive_count: int | None
    content_based_deduplication: bool
    messages: dict[str, StoredMessage] = field(default_factory=dict)
    handles: dict[str, str] = field(default_factory=dict)
    deduplication: dict[str, tuple[str, float]] = field(default_factory=dict)

    @property
    def fifo(self) -> bool:
        return self.name.endswith(".fifo")


class MemoryBroker:
    """The queues of one in-memory SQS, sharing a lock and a clock."""

    def __init__(self, clock: MemoryClock | None = None) -> None:
        self.clock = clock or MemoryClock()
        self._lock = threading.Lock()
        self._queues: dict[str, _QueueState] = {}
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._sequence = itertools.count(1)

    # ------------------------------------------------------------------------------------------- queues

    def create_queue(
        self,
        name: str,
        *,
        dead_letter_queue: str | None = None,
        max_receive_count: int | None = None,
        visibility_timeout_s: int = 30,
        delay_s: int = 0,
        maximum_message_bytes: int = SQS_MAX_MESSAGE_BYTES,
        content_based_deduplication: bool = False,
    ) -> MemoryQueue:
        """Create a queue (a name ending in ``.fifo`` makes a FIFO queue); an existing one is returned as is.
        ``dead_letter_queue`` (an existing queue) with ``max_receive_count`` is its redrive policy."""
        with self._lock:
            if name not in self._queues:
                if (dead_letter_queue is None) != (max_receive_count is None):
                    raise ConfigError("a redrive policy needs both dead_letter_queue and max_receive_count")
                if dead_letter_queue is not None:
                    target = self._queues.get(dead_letter_queue)
                    if target is None:
                        raise ConfigError(f"dead-letter queue {dead_letter_queue!r} does not exist")
                    if target.fifo != name.endswith(".fifo"):
                        raise ConfigError("a FIFO queue needs a FIFO dead-letter queue, a standard one a standard")
                if not 0 <= delay_s <= MAX_DELAY_S or not 0 <= visibility_timeout_s <= MAX_VISIBILITY_TIMEOUT_S:
                    raise ConfigError("delay_s must be 0-900 and visibility_timeout_s 0-43200")
                self._queues[name] = _QueueState(
                    name=name,
                    visibility_timeout_s=visibility_timeout_s,
                    delay_s=delay_s,
                    maximum_message_bytes=maximum_message_bytes,
                    dead_letter_queue=dead_letter_queue,
                    max_receive_count=max_receive_count,
                    content_based_deduplication=content_based_deduplication,
                )
        return MemoryQueue(self, name)

    def configure(
        self,
        name: str,
        *,
        dead_letter_queue: str | None = None,
        max_receive_count: int | None = None,
        visibility_timeout_s: int | None = None,
        delay_s: int | None = None,
        maximum_message_bytes: int | None = None,
    ) -> None:
        """Change a queue's attributes (SetQueueAttributes): the given ones, the others as they are."""
        with self._lock:
            state = self._state(name)
            if dead_letter_queue is not None:
                target = self._state(dead_letter_queue)
                if target.fifo != state.fifo:
                    raise ConfigError("a FIFO queue needs a FIFO dead-letter queue, a standard one a standard")
                state.dead_letter_queue = dead_letter_queue
                state.max_receive_count = max_receive_count or state.max_receive_count or 10
            elif max_receive_count is not None:
                state.max_receive_count = max_receive_count
            if visibility_timeout_s is not None:
                state.visibility_timeout_s = visibility_timeout_s
            if delay_s is not None:
                state.delay_s = delay_s
            if maximum_message_bytes is not None:
                state.maximum_message_bytes = maximum_message_bytes

    def attributes(self, name: str) -> dict[str, str]:
        """A queue's attributes by their SQS names (GetQueueAttributes), its counts among them."""
        counts = self.counts(name)
        with self._lock:
            state = self._state(name)
            attributes = {
                "QueueArn": f"arn:aws:sqs:memory:000000000000:{name}",
                "VisibilityTimeout": str(state.visibility_timeout_s),
                "DelaySeconds": str(state.delay_s),
                "MaximumMessageSize": str(state.maximum_message_bytes),
                "ApproximateNumberOfMessages": str(counts.visible),
                "ApproximateNumberOfMessagesNotVisible": str(counts.in_flight),
                "ApproximateNumberOfMessagesDelayed": str(counts.delayed),
            }
            if state.fifo:
                attributes["FifoQueue"] = "true"
                attributes["ContentBasedDeduplication"] = str(state.content_based_deduplication).lower()
            if state.dead_letter_queue is not None:
                target = f"arn:aws:sqs:memory:000000000000:{state.dead_letter_queue}"
                attributes["RedrivePolicy"] = json.dumps(
                    {"deadLetterTargetArn": target, "maxReceiveCount": state.max_receive_count}
                )
            return attributes

    def queue(self, name: str) -> MemoryQueue:
        """An existing queue; ConfigError when there is none by that name (as GetQueueUrl would say)."""
        self._state(name)
        return MemoryQueue(self, name)

    def queue_names(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    def _state(self, name: str) -> _QueueState:
        state = self._queues.get(name)
        if state is None:
            raise ConfigError(f"queue {name!r} does not exist")
        return state

    # ------------------------------------------------------------------------------------------- inspecting

    def counts(self, name: str) -> QueueCounts:
        with self._lock:
            state = self._state(name)
            now = self.clock.monotonic()
            visible = in_flight = delayed = 0
            for message in state.messages.values():
                if message.visible_at <= now:
                    visible += 1
                elif message.receive_count:
                    in_flight += 1
                else:
                    delayed += 1
            return QueueCounts(visible, in_flight, delayed)

    def messages(self, name: str) -> list[StoredMessage]:
        """Copies of the messages a queue holds, in the order they were sent, without receiving them."""
        with self._lock:
            return [_copy(message) for message in self._state(name).messages.values()]

    def purge(self, name: str) -> None:
        with self._lock:
            state = self._state(name)
            state.messages.clear()
            state.handles.clear()

    def next_due_s(self, name: str | None = None) -> float | None:
        """Seconds until a message of queue ``name`` (default: any queue) can next be received (on FIFO queues,
        the first of its group); 0 when one can now, None when the queue is empty."""
        with self._lock:
            return self._next_due_s(self.clock.monotonic(), name)

    def advance_to_next_due(self, name: str | None = None) -> float:
        """Skip the clock to when a message of queue ``name`` (default: any) can next be received, so a retry's
        backoff or a delay passes at once; returns the seconds skipped. Skips nothing while one can be received
        now, or one is received and not yet given a visibility since (its consumer may be about to take it up:
        skipping would let its claim lapse under it)."""
        with self._lock:
            now = self.clock.monotonic()
            states = [self._state(name)] if name is not None else list(self._queues.values())
            if any(m.claimed and m.visible_at > now for state in states for m in state.messages.values()):
                return 0.0
            skip_s = self._next_due_s(now, name) or 0.0
            if skip_s > 0:
                self.clock.advance(skip_s)
        if skip_s > 0:
            self._notify()
        return skip_s

    def _next_due_s(self, now: float, name: str | None = None) -> float | None:
        states = [self._state(name)] if name is not None else list(self._queues.values())
        due = [moment for state in states for moment in _deliverable_at(state)]
        return max(0.0, min(due) - now) if due else None

    # ------------------------------------------------------------------------------------------- sending

    def send(
        self,
        name: str,
        body: str,
        *,
        attributes: Mapping[str, Any] | None = None,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        delay_s: int | None = None,
    ) -> str:
        """Send one message as SendMessage would; returns its MessageId (a duplicate's: the original's)."""
        with self._lock:
            state = self._state(name)
            attributes = {key: dict(value) for key, value in (attributes or {}).items()}
            _check_content(state, body, attributes, delay_s=delay_s, group_id=group_id)
            now = self.clock.monotonic()
            if state.fifo:
                if deduplication_id is None and state.content_based_deduplication:
                    deduplication_id = hashlib.sha256(body.encode("utf-8")).hexdigest()
                if deduplication_id is None:
                    raise _refused(
                        state,
                        "InvalidParameterValue",
                        "the queue needs a MessageDeduplicationId or content-based deduplication",
                    )
                seen = state.deduplication.get(deduplication_id)
                if seen is not None and now - seen[1] < DEDUPLICATION_WINDOW_S:
                    return seen[0]
            message_id = str(uuid.uuid4())
            state.messages[message_id] = StoredMessage(
                message_id=message_id,
                body=body,
                message_attributes=attributes,
                sent_at_ms=int(self.clock.time() * 1000),
                visible_at=now + (delay_s if delay_s is not None and not state.fifo else state.delay_s),
                group_id=group_id if state.fifo else None,
                deduplication_id=deduplication_id if state.fifo else None,
                sequence_number=next(self._sequence) if state.fifo else None,
            )
            if state.fifo and deduplication_id is not None:
                state.deduplication[deduplication_id] = (message_id, now)
        self._notify()
        return message_id

    # ------------------------------------------------------------------------------------------- receiving

    def receive_now(self, name: str, *, max_messages: int, visibility_timeout_s: int | None = None) -> list[Message]:
        """What one ReceiveMessage without waiting returns."""
        messages, _ = self._take(name, max_messages, visibility_timeout_s, waiter=None)
        return messages

    async def receive(
        self, name: str, *, max_messages: int, wait_s: float, visibility_timeout_s: int | None = None
    ) -> list[Message]:
        """ReceiveMessage with long polling: returns as soon as a message is there, or after ``wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            messages, next_due_s = self._take(name, max_messages, visibility_timeout_s, waiter=(loop, waiter))
            remaining_s = deadline - loop.time()
            if messages or remaining_s <= 0:
                self._forget(waiter)
                return messages
            timeout_s = remaining_s if next_due_s is None else min(remaining_s, next_due_s)
            try:
                await asyncio.wait_for(waiter, timeout=max(timeout_s, 0.001))
            except TimeoutError:
                pass
            finally:
                self._forget(waiter)

    def _take(
        self,
        name: str,
        max_messages: int,
        visibility_timeout_s: int | None,
        *,
        waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None,
    ) -> tuple[list[Message], float | None]:
        moved = False
        with self._lock:
            state = self._state(name)
            now = self.clock.monotonic()
            timeout_s = state.visibility_timeout_s if visibility_timeout_s is None else visibility_timeout_s
            picked: list[Message] = []
            blocked: set[str | None] = set()
            for message in list(state.messages.values()):
                if len(picked) >= max(1, min(10, max_messages)):
                    break
                if state.fifo and message.group_id in blocked:
                    continue
                if message.visible_at > now:
                    if state.fifo:
                        blocked.add(message.group_id)  # an earlier message in flight or delayed holds its group
                    continue
                if state.max_receive_count is not None and message.receive_count >= state.max_receive_count:
                    self._redrive(state, message)
                    moved = True
                    continue
                picked.append(self._deliver(state, message, now, timeout_s))
            next_due_s = None if picked else self._next_due_s(now, name)
            if not picked and waiter is not None:
                self._waiters.append(waiter)
        if moved:
            self._notify()
        return picked, next_due_s

    def _deliver(self, state: _QueueState, message: StoredMessage, now: float, timeout_s: int) -> Message:
        message.receive_count += 1
        message.claimed = True
        message.receipt_handle = f"{message.message_id}#{uuid.uuid4().hex}"
        message.received_at = now
        message.visible_at = now + timeout_s
        if message.first_receive_ms is None:
            message.first_receive_ms = int(self.clock.time() * 1000)
        state.handles[message.receipt_handle] = message.message_id
        attributes = {
            "ApproximateReceiveCount": str(message.receive_count),
            "SentTimestamp": str(message.sent_at_ms),
            "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
            "SenderId": "memory",
        }
        if message.group_id is not None:
            attributes["MessageGroupId"] = message.group_id
        if message.deduplication_id is not None:
            attributes["MessageDeduplicationId"] = message.deduplication_id
        if message.sequence_number is not None:
            attributes["SequenceNumber"] = str(message.sequence_number)
        return Message(
            message_id=message.message_id,
            receipt_handle=message.receipt_handle,
            body=message.body,
            attributes=attributes,
            message_attributes={name: dict(value) for name, value in message.message_attributes.items()},
        )

    def _redrive(self, state: _QueueState, message: StoredMessage) -> None:
        """SQS's redrive: the message moves to the dead-letter queue as it is (no attributes added)."""
        assert state.dead_letter_queue is not None
        target = self._queues.get(state.dead_letter_queue)
        del state.messages[message.message_id]
        if target is None:  # the DLQ was deleted: SQS keeps the message where it is; so do we
            state.messages[message.message_id] = message
            return
        moved = _copy(message)
        moved.visible_at = self.clock.monotonic()
        moved.receipt_handle = None
        moved.claimed = False
        target.messages[moved.message_id] = moved

    # ------------------------------------------------------------------------------------------- settling

    def delete(self, name: str, receipt_handle: str) -> None:
        with self._lock:
            state = self._state(name)
            message_id = state.handles.get(receipt_handle)
            if message_id is None:
                raise EntryFailed("ReceiptHandleIsInvalid", f"the receipt handle {receipt_handle!r} is not valid")
            message = state.messages.get(message_id)
            if message is not None and message.receipt_handle == receipt_handle:
                del state.messages[message_id]  # its handles stay known: deleting again succeeds, as on SQS
        self._notify()

    def set_visibility(self, name: str, receipt_handle: str, timeout_s: int) -> None:
        with self._lock:
            state = self._state(name)
            message = state.messages.get(state.handles.get(receipt_handle, ""))
            now = self.clock.monotonic()
            if message is None or message.receipt_handle != receipt_handle:
                raise EntryFailed("ReceiptHandleIsInvalid", "the message was deleted or received again")
            if message.visible_at <= now:
                raise EntryFailed("MessageNotInflight", "the message is not in flight")
            assert message.received_at is not None
            if not 0 <= timeout_s <= visibility_cap_s(elapsed_since_receive_s=now - message.received_at):
                raise EntryFailed("InvalidParameterValue", "the visibility timeout exceeds the 12-hour limit")
            message.visible_at = now + timeout_s
            message.claimed = False
        self._notify()

    # ------------------------------------------------------------------------------------------- waking

    def _notify(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # its loop is closed: nobody waits any more
                continue

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with self._lock:
            self._waiters = [(loop, w) for loop, w in self._waiters if w is not waiter]


class MemoryQueue:
    """One queue of a :class:`MemoryBroker`, as the runtime talks to it (a MessageQueue)."""

    def __init__(self, broker: MemoryBroker, name: str) -> None:
        self.broker = broker
        self._name = name
        self.url = f"memory://{name}"
        self.receive_calls = 0
        self.send_calls = 0
        self.delete_calls = 0
        self.visibility_calls = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_fifo(self) -> bool:
        return self._name.endswith(".fifo")

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.receive_calls += 1
        return await self.broker.receive(
            self._name, max_messages=max_messages, wait_s=wait_s, visibility_timeout_s=visibility_timeout_s
        )

    async def delete(self, receipt_handle: str) -> None:
        self.delete_calls += 1
        self.broker.delete(self._name, receipt_handle)

    async def set_visibility(self, receipt_handle: str, timeout_s: int) -> None:
        self.visibility_calls += 1
        self.broker.set_visibility(self._name, receipt_handle, timeout_s)

    async def send(
        self,
        body: str,
        *,
        attributes: dict[str, Any] | None = None,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        delay_s: int | None = None,
    ) -> str:
        self.send_calls += 1
        return self.broker.send(
            self._name,
            body,
            attributes=attributes,
            group_id=(group_id or "default") if self.is_fifo else None,
            deduplication_id=deduplication_id,
            delay_s=delay_s,
        )

    def send_entry(self, entry: Mapping[str, Any]) -> str:
        """Send one SendMessage (or SendMessageBatch entry) as ``worker.producer`` builds it; returns its id."""
        self.send_calls += 1
        return self.broker.send(
            self._name,
            entry["MessageBody"],
            attributes=entry.get("MessageAttributes"),
            group_id=entry.get("MessageGroupId"),
            deduplication_id=entry.get("MessageDeduplicationId"),
            delay_s=entry.get("DelaySeconds"),
        )

    async def maximum_message_bytes(self) -> int | None:
        with self.broker._lock:
            return self.broker._state(self._name).maximum_message_bytes

    async def drain(self) -> None:
        """Nothing is batched in memory: every call took effect when it was made."""

    @property
    def request_count(self) -> int:
        return self.receive_calls + self.send_calls + self.delete_calls + self.visibility_calls

    def counts(self) -> QueueCounts:
        return self.broker.counts(self._name)

    def messages(self) -> list[StoredMessage]:
        return self.broker.messages(self._name)


def _deliverable_at(state: _QueueState) -> list[float]:
    """When each message could next be received: its visibility, and on a FIFO queue only for the first
    message of each group (the others wait for it)."""
    if not state.fifo:
        return [message.visible_at for message in state.messages.values()]
    heads: dict[str | None, float] = {}
    for message in state.messages.values():
        heads.setdefault(message.group_id, message.visible_at)
    return list(heads.values())


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _copy(message: StoredMessage) -> StoredMessage:
    copied = StoredMessage(**{**message.__dict__})
    copied.message_attributes = {name: dict(value) for name, value in message.message_attributes.items()}
    return copied


def _refused(state: _QueueState, code: str, text: str) -> Exception:
    """The error SQS answers a refused SendMessage with, translated as the SQS backend translates it."""
    response: Any = {"Error": {"Code": code, "Message": text}, "ResponseMetadata": {"HTTPStatusCode": 400}}
    error = ClientError(response, "SendMessage")
    translated = translate(error, "SendMessage", resource=state.name)
    translated.__cause__ = error
    return translated


def _check_content(
    state: _QueueState, body: str, attributes: dict[str, dict[str, Any]], *, delay_s: int | None, group_id: str | None
) -> None:
    if not body:
        raise _refused(state, "MissingParameter", "the message body must not be empty")
    if _REFUSED_CHARS.search(body):
        raise _refused(state, "InvalidMessageContents", "the message body holds characters SQS does not accept")
    if len(attributes) > MAX_MESSAGE_ATTRIBUTES:
        raise _refused(state, "InvalidParameterValue", f"{len(attributes)} message attributes exceed the 10 allowed")
    for attribute, value in attributes.items():
        text = value.get("StringValue")
        if "BinaryValue" not in value and not text:
            raise _refused(state, "InvalidParameterValue", f"message attribute {attribute!r} has an empty value")
        if isinstance(text, str) and _REFUSED_CHARS.search(text):
            raise _refused(state, "InvalidParameterValue", f"message attribute {attribute!r} holds refused characters")
    size = message_bytes(body, attributes)
    if size > state.maximum_message_bytes:
        raise _refused(
            state, "InvalidParameterValue", f"{size} bytes exceed the queue's {state.maximum_message_bytes}-byte limit"
        )
    if delay_s is not None and not 0 <= delay_s <= MAX_DELAY_S:
        raise _refused(state, "InvalidParameterValue", "DelaySeconds must be between 0 and 900")
    if state.fifo:
        if delay_s:
            raise _refused(state, "InvalidParameterValue", "FIFO queues take no per-message DelaySeconds")
        if not group_id:
            raise _refused(state, "MissingParameter", "a FIFO queue needs a MessageGroupId")
