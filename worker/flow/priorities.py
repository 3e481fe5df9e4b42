"""Priorities across queues: which queue of a worker's set gets the next free slots (pure; no I/O, no clock).

A worker consuming several queues (``WORKER_QUEUES=critical:10,default:3,bulk:1``) asks this policy, each time
slots are free, which queue a receive goes to and for how many messages. The runtime reports back what each
receive did (``lent``: unanswered after a short while, so its queue looks empty and its slots went to the others;
``answered``: it brought ``received`` messages).

Rules:

- A queue with a receive open on it that went unanswered (a long poll on an empty queue) gets no other receive:
  that one long poll brings its messages the moment they arrive. So an idle queue costs one long poll. When a
  queue's last answer was full, its first unanswered receive may be a slow endpoint rather than an empty queue:
  it gets one more receive, and only a second unanswered one in a row makes it count as empty.
- A queue gets one receive at a time, unless its last answer was full (as many messages as asked) and either
  more than one or prompt (not lent: SQS answered at once, as it does from a backlog; a long poll that waited
  for an arrival was lent first): a backlog; then as many as the free slots allow. Slots freeing one at a time
  make one-for-one answers: counted as a backlog, they keep a weighted share even when receives take longer
  than jobs take to free slots.
- A receive asks for at most 10 messages and at most the free slots, and a queue asks for at most twice what its
  last answer brought (at least 1): an idle queue's long poll holds one slot, not ten.
- ``weighted``: the queues share slots by weight (stride scheduling: each queue's slots divided by its weight is
  its virtual time; the lowest goes next, ties to the earlier queue; a queue that was idle starts at the current
  virtual time, so it cannot claim a backlog of turns).
- ``strict``: the first eligible queue in the set's order; a lower queue gets a receive only while every higher
  one is drained: its last answer brought fewer messages than asked (none, or a partial batch: SQS had no more),
  or its long poll waits unanswered.
- A set of one queue is today's single queue: every free slot goes to it, up to 10 per receive.

When does an unanswered receive count as a long poll on an empty queue? SQS answers a receive at once when the
queue holds messages, so a receive still open after several times the endpoint's usual answer time (``AnswerTimes``:
at least 50 ms) is waiting on an empty queue (or on a stalled endpoint, which looks the same). The usual answer
time is a low quantile of recent answers that brought messages: an answer that waited for a message to arrive
takes longer than the endpoint does, and a quarter of prompt answers (from a backlog) are enough to see through it.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

#: SQS returns at most 10 messages per ReceiveMessage.
MAX_PER_RECEIVE = 10
#: A weight is a whole number in this range.
MAX_WEIGHT = 1000

_WEIGHT = re.compile(r"^(?P<queue>.*):\s*(?P<weight>\d+)\s*$")


class Mode(StrEnum):
    WEIGHTED = "weighted"
    STRICT = "strict"


@dataclass(frozen=True)
class QueueSpec:
    """One queue of a set: its name or URL and its weight (weighted mode)."""

    queue: str
    weight: int = 1


def parse_queue_set(text: str) -> tuple[QueueSpec, ...]:
    """``critical:10,default:3,bulk:1`` (highest priority first; a missing weight is 1; names or URLs, a weight is
    a trailing ``:<digits>``). Raises ValueError naming what is wrong."""
    specs: list[QueueSpec] = []
    for part in (item.strip() for item in text.split(",")):
        if not part:
            continue
        match = _WEIGHT.match(part)
        queue, weight = (match["queue"].strip(), int(match["weight"])) if match else (part, 1)
        if not match and ":" in part and not part.startswith(("http://", "https://", "arn:")):
            raise ValueError(f"{part!r}: a weight is a whole number 1..{MAX_WEIGHT} after the last ':'")
        if not queue:
            raise ValueError(f"{part!r} names no queue")
        if not 1 <= weight <= MAX_WEIGHT:
            raise ValueError(f"{part!r}: the weight must be 1..{MAX_WEIGHT}")
        specs.append(QueueSpec(queue, weight))
    if not specs:
        raise ValueError("names no queue (e.g. critical:10,default:3,bulk:1)")
    names = [_name_of(spec.queue) for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"names {', '.join(repeated)} more than once")
    return tuple(specs)


def _name_of(queue: str) -> str:
    return queue.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


class AnswerTimes:
    """How long receives that brought messages took (the lower quartile of the last ``window``; ``initial_s``
    before any), and from when an unanswered receive counts as a long poll on an empty queue: ``factor`` times
    that, at least ``floor_s``."""

    def __init__(self, *, floor_s: float, initial_s: float = 0.1, factor: float = 5.0, window: int = 20) -> None:
        self.floor_s = floor_s
        self.initial_s = initial_s
        self.factor = factor
        self._recent: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float) -> None:
        self._recent.append(max(0.0, seconds))

    @property
    def typical_s(self) -> float:
        if not self._recent:
            return self.initial_s
        return sorted(self._recent)[len(self._recent) // 4]

    def empty_after_s(self) -> float:
        return max(self.floor_s, self.factor * self.typical_s)


@dataclass(frozen=True)
class Grant:
    """A receive to start: on the queue at ``index``, for ``count`` messages (the slots it reserves)."""

    index: int
    count: int


@dataclass
class QueueState:
    """What the policy knows of one queue."""

    weight: int
    receives: int = 0  # receives in flight
    listening: int = 0  # of them, unanswered and lent: long polls waiting on a queue that looked empty
    busy: bool = True  # its last answer brought messages (True before the first: it may hold some)
    last_received: int | None = None  # messages of its last answer (None: none yet)
    last_asked: int = 0  # what its last answer was asked for
    last_prompt: bool = False  # its last answer came before its receive was lent (SQS answered at once)
    served: float = 0.0  # slots it used, divided by its weight (virtual time, weighted mode)

    def wants(self) -> int:
        """How many messages its next receive may ask for."""
        if self.last_received is None:
            return MAX_PER_RECEIVE
        return min(MAX_PER_RECEIVE, max(1, 2 * self.last_received))

    @property
    def drained(self) -> bool:
        """Its last answer brought fewer messages than asked (none, or a partial batch), or its long poll waits
        unanswered: as far as SQS said, it holds no more."""
        return not self.busy or (self.last_received is not None and self.last_received < self.last_asked)

    @property
    def full(self) -> bool:
        """Its last answer brought as many messages as asked (at least one): it may hold more."""
        return self.busy and self.last_received is not None and self.last_received >= self.last_asked >= 1

    @property
    def backlogged(self) -> bool:
        """Its last answer brought as many messages as asked, and more than one or at once: more are likely
        waiting (one message for one asked after a wait is what a long poll brings when a job arrives)."""
        return self.full and (self.last_asked >= 2 or self.last_prompt)

    def eligible(self) -> bool:
        if self.receives == 0:
            return True
        if self.backlogged:  # as many receives as the slots allow, also past one stalled receive
            return self.listening <= 1
        # Otherwise one at a time (a long poll brings the messages as they arrive), but one more past a stalled
        # receive when the last answer was full: it may be a slow endpoint, not an empty queue.
        return self.full and self.listening == 1 and self.receives == 1


class Priorities:
    """The selection policy over a set of queues (highest priority first)."""

    def __init__(self, weights: Sequence[int], *, mode: Mode = Mode.WEIGHTED) -> None:
        if not weights:
            raise ValueError("a queue set needs at least one queue")
        if any(weight < 1 for weight in weights):
            raise ValueError("weights must be >= 1")
        self.mode = mode
        self.queues = [QueueState(weight) for weight in weights]
        self._virtual_time = 0.0

    @property
    def single(self) -> bool:
        return len(self.queues) == 1

    def next(self, free: int) -> Grant | None:
        """The receive to start with ``free`` free slots, or None (no queue needs one now). Records it."""
        if free < 1:
            return None
        if self.single:
            grant = Grant(0, min(MAX_PER_RECEIVE, free))
        else:
            index = self._pick()
            if index is None:
                return None
            grant = Grant(index, min(free, self.queues[index].wants()))
        state = self.queues[grant.index]
        state.receives += 1
        start = max(state.served, self._virtual_time)
        self._virtual_time = start
        state.served = start + grant.count / state.weight
        return grant

    def _pick(self) -> int | None:
        eligible = [index for index, state in enumerate(self.queues) if state.eligible()]
        if not eligible:
            return None
        if self.mode is Mode.STRICT:
            first = eligible[0]
            return first if all(self.queues[index].drained for index in range(first)) else None
        return min(eligible, key=lambda index: (max(self.queues[index].served, self._virtual_time), index))

    def hedges(self, index: int) -> bool:
        """Whether a receive on the queue at ``index`` unanswered after a short while gives its slots back
        (``lent``): in a set always (the other queues may use them); a single queue only while busy (an endpoint
        slow to answer, not a long poll on an empty queue)."""
        return not self.single or self.queues[index].busy

    def lent(self, index: int, count: int) -> None:
        """A receive of ``count`` slots went unanswered and gave its slots back. In a set its queue counts as
        empty (a long poll waits on it) when it was not busy, or at the second such receive in a row; a single
        queue keeps its state (a stalled endpoint)."""
        state = self.queues[index]
        state.served -= count / state.weight
        if not self.single:
            state.listening += 1
            if state.listening >= 2 or not state.full:
                state.busy = False  # its last answer was partial or empty, or a second one in a row: it is empty

    def answered(self, index: int, *, asked: int, received: int, lent: bool) -> None:
        """A receive of ``asked`` slots brought ``received`` messages (``lent``: after it gave its slots back)."""
        state = self.queues[index]
        state.receives -= 1
        if lent:
            state.listening -= 1
            state.served += min(received, asked) / state.weight
        else:
            state.served -= (asked - min(received, asked)) / state.weight
        state.busy = received > 0
        state.last_received = received
        state.last_asked = asked
        state.last_prompt = not lent

    def failed(self, index: int, *, asked: int, lent: bool) -> None:
        """A receive failed (the endpoint erred): nothing was received; the queue's state stays as it was."""
        state = self.queues[index]
        state.receives -= 1
        if lent:
            state.listening -= 1
        else:
            state.served -= asked / state.weight
