"""Pure retry policy: how long to wait before the next attempt and what a failure means.

No clocks, no clients: values in, decisions out. The runtime applies the decisions.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from enum import StrEnum

from worker.errors import PermanentError, RetryableError

#: SQS caps a message's visibility at 12 hours from its receive.
MAX_VISIBILITY_S = 43_200

PERMANENT = "permanent"
BUG = "bug"
EXHAUSTED = "exhausted"


def backoff_delay_s(
    attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None, jitter: float | None = None
) -> int:
    """Seconds to wait after failed attempt ``attempt`` (1-based).

    Drawn between 50% and 100% of ``min(max_s, base_s * 2 ** (attempt - 1))``, rounded up to whole seconds,
    so delays grow visibly and a burst of failures does not retry in lockstep. ``jitter`` in [0, 1] fixes
    the draw (0 gives the 50% end, 1 the full delay); otherwise ``rng`` (or ``random``) draws it.
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    ceiling = min(max_s, base_s * 2.0 ** min(attempt - 1, 64))
    if jitter is None:
        jitter = (rng or random).random()
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be within [0, 1]")
    delay = ceiling * (0.5 + 0.5 * jitter)
    return min(MAX_VISIBILITY_S, math.ceil(delay - 1e-9))


class Action(StrEnum):
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class Decision:
    """What to do with a failed attempt."""

    action: Action
    category: str | None = None  # dead-letter category
    delay_s: int | None = None  # retry: seconds until the message reappears


def classify_failure(
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    permanent: tuple[type[BaseException], ...] = (),
    bugs: tuple[type[BaseException], ...] = (),
    backoff_base_s: float,
    backoff_max_s: float,
    jitter: float | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """Decide between retry (with its delay) and dead-letter (with its category) for a failed attempt.

    Order: PermanentError and the job's ``permanent`` types dead-letter as ``permanent``; RetryableError and
    timeouts are retried; the job's ``bugs`` (programming errors) dead-letter as ``bug``; anything else is
    retried. A retry on or past the last attempt dead-letters as ``exhausted`` instead.
    """
    if isinstance(error, PermanentError) or (permanent and isinstance(error, permanent)):
        return Decision(Action.DEAD_LETTER, category=PERMANENT)
    retryable_by_kind = isinstance(error, RetryableError | TimeoutError)
    if not retryable_by_kind and bugs and isinstance(error, bugs):
        return Decision(Action.DEAD_LETTER, category=BUG)
    if attempt >= max_attempts:
        return Decision(Action.DEAD_LETTER, category=EXHAUSTED)
    if isinstance(error, RetryableError) and error.delay_s is not None:
        delay = min(MAX_VISIBILITY_S, math.ceil(error.delay_s))
    else:
        delay = backoff_delay_s(attempt, base_s=backoff_base_s, max_s=backoff_max_s, jitter=jitter, rng=rng)
    return Decision(Action.RETRY, delay_s=delay)


def visibility_cap_s(*, elapsed_since_receive_s: float, margin_s: float = 5.0) -> int:
    """The longest visibility that may still be set: SQS counts the 12-hour cap from the receive."""
    return max(0, int(MAX_VISIBILITY_S - elapsed_since_receive_s - margin_s))


#: Characters SQS accepts in bodies and attribute values (#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD |
#: #x10000-#x10FFFF); DynamoDB and UTF-8 log streams refuse lone surrogates too.
_UNSAFE_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
REPLACEMENT_CHAR = "\ufffd"


def safe_text(text: str) -> str:
    """``text`` with every character SQS refuses (NUL and other controls, lone surrogates, U+FFFE/U+FFFF)
    replaced by U+FFFD, so it can travel as an SQS attribute, a DynamoDB string or a UTF-8 log line."""
    return _UNSAFE_CHARS.sub(REPLACEMENT_CHAR, text)


def error_text(error: BaseException) -> str:
    """``str(error)``, or ``<unprintable Type>`` when its ``__str__`` raises or returns no str."""
    try:
        text = str(error)
    except Exception:
        return f"<unprintable {type(error).__name__}>"
    return text if isinstance(text, str) else f"<unprintable {type(error).__name__}>"


def describe_error(error: BaseException, *, limit: int = 1000) -> str:
    """``Type: message`` of an exception, truncated to ``limit`` characters and made safe to send anywhere.

    Never raises: an exception whose ``__str__`` fails is described as ``Type: <unprintable Type>``.
    """
    message = error_text(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return safe_text(truncate(text, limit))


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut so that its UTF-8 encoding takes at most ``max_bytes`` bytes, marked with a trailing "…"."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    if max_bytes < 3:
        return ""
    return encoded[: max_bytes - 3].decode("utf-8", "ignore") + "…"
