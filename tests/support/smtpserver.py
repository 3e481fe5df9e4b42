"""A local SMTP server (aiosmtpd, in its own thread) that keeps what it accepts and refuses on command."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Mailbox:
    """What the server accepted, and the answers it gives to RCPT TO before accepting (popped in order)."""

    host: str = "127.0.0.1"
    port: int = 0
    accepted: list[Message] = field(default_factory=list)
    rcpt_answers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refuse_next(self, *answers: str) -> None:
        with self.lock:
            self.rcpt_answers.extend(answers)


class _Handler:
    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        with self.mailbox.lock:
            answer = self.mailbox.rcpt_answers.pop(0) if self.mailbox.rcpt_answers else None
        if answer is not None:
            return answer
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.mailbox.lock:
            self.mailbox.accepted.append(message_from_bytes(envelope.content))
            count = len(self.mailbox.accepted)
        return f"250 2.0.0 Ok: queued as TEST{count:04d}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def smtp_server() -> Iterator[Mailbox]:
    mailbox = Mailbox(port=free_port())
    controller = Controller(_Handler(mailbox), hostname=mailbox.host, port=mailbox.port)
    controller.start()
    try:
        yield mailbox
    finally:
        controller.stop()
