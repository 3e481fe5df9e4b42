"""Dead-letter tooling: pure grouping and rules, and every dlq command against each backend."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import drain, sqs_client
from tests.support.queues import assert_queue_empty, message_count
from worker.commands.__main__ import main
from worker.errors import WorkerError
from worker.ops.bootstrap import Created
from worker.ops.dlq import DeadLetterQueue, redrive_by_receiving
from worker.ops.dlq_records import DeadLetter, format_groups, group_dead_letters, redrive_attributes, requeue_attributes
from worker.ops.progress import RateLimiter, render_progress

# ------------------------------------------------------------------------------------------------ pure

pytestmark = pytest.mark.usefixtures("restore_logging")


def letter(category: str = "bug", error: str = "TypeError: boom", **attrs: str) -> DeadLetter:
    values = {"error_category": category, "error_message": error, "original_message_id": uuid.uuid4().hex, **attrs}
    return DeadLetter(
        message_id=uuid.uuid4().hex,
        receipt_handle="rh",
        body=json.dumps({"type": "send_email", "payload": {"password": "x"}}),
        attributes={k: {"DataType": "String", "StringValue": v} for k, v in values.items()},
        system={},
    )


def test_groups_by_category_and_error_biggest_first() -> None:
    letters = [
        letter("permanent", "account closed", failed_at="2026-01-02T00:00:00.000Z"),
        letter("bug", "TypeError: boom", failed_at="2026-01-01T00:00:00.000Z"),
        letter("bug", "TypeError: boom", failed_at="2026-01-03T00:00:00.000Z"),
        letter("bug", "KeyError: 'x'"),
    ]
    groups = group_dead_letters(letters)
    assert [(g.category, g.error_message, g.count) for g in groups] == [
        ("bug", "TypeError: boom", 2),
        ("bug", "KeyError: 'x'", 1),
        ("permanent", "account closed", 1),
    ]
    assert groups[0].first_failed_at == "2026-01-01T00:00:00.000Z"
    assert groups[0].last_failed_at == "2026-01-03T00:00:00.000Z"
    assert dict(groups[0].job_types) == {"send_email": 2}
    table = format_groups(groups, read=4, approximate_total=9)
    assert "TypeError: boom" in table
    # The ids `dlq show ID` and `dlq requeue ID...` take, a few per group, under the group's line.
    assert groups[0].message_ids and all(f"ids: {' '.join(g.message_ids)}" in table for g in groups)
    assert "raise --limit" in table
    assert "password" not in table  # payloads are never shown in the listing


def test_redrive_strips_only_the_dead_letter_record() -> None:
    item = letter(tenant="acme")
    assert redrive_attributes(item) == {"tenant": {"DataType": "String", "StringValue": "acme"}}


def test_requeue_adds_the_audit_and_refuses_when_it_does_not_fit() -> None:
    at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    attrs = requeue_attributes(letter(tenant="acme"), by="alice", at=at, reason="fixed the bug")
    assert {k: v["StringValue"] for k, v in attrs.items() if k != "requeued_from"} == {
        "tenant": "acme",
        "requeued_by": "alice",
        "requeued_at": "2026-03-04T05:06:07.000Z",
        "requeue_reason": "fixed the bug",
    }
    crowded = letter(**{f"a{i}": "v" for i in range(7)})
    with pytest.raises(WorkerError, match="do not fit"):
        requeue_attributes(crowded, by="a", at=at, reason="r")


def test_requeue_audit_values_hold_only_characters_sqs_accepts() -> None:
    """An ESC pasted from a terminal (or a NUL) in --reason or --by: SQS refused the send and nothing moved."""
    at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    attrs = requeue_attributes(letter(), by="ops\x07", at=at, reason="fixed \x1b[32mOK\x1b[0m\x00 \u202edone")
    assert attrs["requeued_by"]["StringValue"] == "ops\ufffd"
    assert attrs["requeue_reason"]["StringValue"] == "fixed \ufffd[32mOK\ufffd[0m\ufffd \u202edone"


def test_rate_limiter_spaces_batches() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(10, monotonic=lambda: now[0], sleep=sleep)
    for _ in range(5):
        limiter.acquire(10)
    # The first 10 go at once (a second's burst); each further 10 waits a second.
    assert slept == pytest.approx([1.0, 1.0, 1.0, 1.0])
    unlimited = RateLimiter(None, monotonic=lambda: 0.0, sleep=sleep)
    unlimited.acquire(1000)
    assert len(slept) == 4


def test_render_progress() -> None:
    assert render_progress(5, 10, width=10) == "[#####.....]  5/10 moved"
    assert render_progress(3, None, failed=1) == "3 moved (1 failed)"


# ------------------------------------------------------------------------------------------------ backends


def dead_letter(
    endpoint_url: str, dlq_url: str, body: str, *, category: str, error: str, extra: dict[str, str] | None = None
) -> str:
    """Put a message into the DLQ the way the worker does (the dead-letter record contract)."""
    original_id = str(uuid.uuid4())
    attributes = {
        "error_category": category,
        "error_message": error,
        "attempts": "3",
        "failed_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "source_queue": "jobs",
        "original_message_id": original_id,
        **(extra or {}),
    }
    sqs_client(endpoint_url).send_message(
        QueueUrl=dlq_url,
        MessageBody=body,
        MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
    )
    return original_id


BODY = '{"type": "send_email",  "payload": {"to": "é中@x", "n": 1}}\n'  # odd spacing and unicode: kept as is


def fill(backend: Backend, queues: Created) -> dict[str, str]:
    ids = {}
    for i in range(3):
        ids[f"perm{i}"] = dead_letter(
            backend.endpoint_url, queues.dlq_url, BODY, category="permanent", error="account closed"
        )
    for i in range(2):
        ids[f"bug{i}"] = dead_letter(
            backend.endpoint_url, queues.dlq_url, BODY, category="bug", error="TypeError: boom", extra={"tenant": "t1"}
        )
    ids["bad"] = dead_letter(backend.endpoint_url, queues.dlq_url, "not json", category="invalid_message", error="x")
    return ids


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def count(endpoint_url: str, url: str) -> int:
    return message_count(sqs_client(endpoint_url), url)


def test_list_groups_and_releases(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    fill(backend, queues)
    code, out, _ = run_cli(capsys, "dlq", "list", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["read"] == 6
    assert [(g["category"], g["error_message"], g["count"]) for g in report["groups"]] == [
        ("permanent", "account closed", 3),
        ("bug", "TypeError: boom", 2),
        ("invalid_message", "x", 1),
    ]
    # Listing released what it read: every message can be received again at once.
    assert len(drain(backend.endpoint_url, queues.dlq_url, expect=6, timeout_s=10)) == 6
    code, out, _ = run_cli(capsys, "dlq", "list")
    assert code == 0
    assert "the dead-letter queue is empty" in out


def test_list_says_in_flight_not_empty(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    fill(backend, queues)
    client = sqs_client(backend.endpoint_url)
    held = 0
    for _ in range(20):  # someone else reads the letters and keeps them (a long visibility timeout)
        response = client.receive_message(QueueUrl=queues.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=300)
        held += len(response.get("Messages", []))
        if held == 6:
            break
    assert held == 6
    code, out, _ = run_cli(capsys, "dlq", "list")
    assert code == 0
    assert "the dead-letter queue is empty" not in out
    assert "0 visible, 6 in flight" in out
    assert "none visible now: 6 in flight" in out
    code, out, _ = run_cli(capsys, "dlq", "list", "--json")
    assert json.loads(out)["approximate_in_flight"] == 6


def test_list_text_shows_ids_to_show(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    ids = fill(backend, queues)
    code, out, _ = run_cli(capsys, "dlq", "list")
    assert code == 0
    assert ids["bug1"] in out and ids["bad"] in out
    shown = next(line.split("ids: ", 1)[1].split()[0] for line in out.splitlines() if "ids: " in line)
    code, out, _ = run_cli(capsys, "dlq", "show", shown)
    assert code == 0 and shown in out


def test_show_by_original_id(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    ids = fill(backend, queues)
    code, out, _ = run_cli(capsys, "dlq", "show", ids["bug1"])
    assert code == 0
    shown = json.loads(out)
    assert shown["original_message_id"] == ids["bug1"]
    assert shown["body"] == BODY
    assert shown["message_attributes"]["tenant"] == "t1"
    assert shown["category"] == "bug"
    code, _, err = run_cli(capsys, "dlq", "show", "no-such-id")
    assert code == 3
    assert "no dead letter" in err
    assert count(backend.endpoint_url, queues.dlq_url) == 6


def test_redrive_moves_everything_back(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    fill(backend, queues)
    code, _, err = run_cli(capsys, "dlq", "redrive")
    assert code == 2, "redrive without --yes and without a terminal must refuse"
    assert "--yes" in err
    code, out, err = run_cli(capsys, "dlq", "redrive", "--yes", "--rate", "100/s")
    assert code == 0, err
    expected_method = "move-task" if backend.name == "localstack" else "receive-send-delete"
    assert f"moved 6 of 6 by {expected_method}" in out
    assert "moved" in err  # the progress line
    # moto lacks StartMessageMoveTask (worker.dev.localaws answers 501; plain moto an HTML 500 page): never the page.
    assert "<html" not in err.lower()
    assert all(len(line) < 400 for line in err.splitlines())
    moved = drain(backend.endpoint_url, queues.queue_url, expect=6, timeout_s=15)
    assert sorted(m["Body"] for m in moved) == sorted([BODY] * 5 + ["not json"])
    if expected_method == "receive-send-delete":
        for message in moved:
            assert not set(message.get("MessageAttributes", {})) & {"error_category", "original_message_id"}
        tenants = [
            m["MessageAttributes"]["tenant"]["StringValue"] for m in moved if "tenant" in m.get("MessageAttributes", {})
        ]
        assert tenants == ["t1", "t1"]
    assert count(backend.endpoint_url, queues.dlq_url) == 0


def test_requeue_by_id_with_audit(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    ids = fill(backend, queues)
    code, out, err = run_cli(capsys, "dlq", "requeue", ids["perm0"], ids["bug0"], "--reason", "fixed in v1.2.3")
    assert code == 0, err
    assert out.count("requeued ") == 2
    assert '"event": "requeued"' in err  # the audit log line (JSON logs on stderr)
    moved = drain(backend.endpoint_url, queues.queue_url, expect=2, timeout_s=10)
    assert len(moved) == 2
    for message in moved:
        attrs = {k: v["StringValue"] for k, v in message["MessageAttributes"].items()}
        assert attrs["requeued_by"] == "pytest-operator"
        assert attrs["requeue_reason"] == "fixed in v1.2.3"
        assert attrs["requeued_at"].endswith("Z")
        assert attrs["requeued_from"] in (ids["perm0"], ids["bug0"])
        assert "error_category" not in attrs
        assert message["Body"] == BODY
    assert count(backend.endpoint_url, queues.dlq_url) == 4


def test_requeue_by_category(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    fill(backend, queues)
    code, _, err = run_cli(capsys, "dlq", "requeue", "--category", "bug", "--reason", "r", "--by", "bob")
    assert code == 0, err
    moved = drain(backend.endpoint_url, queues.queue_url, expect=2, timeout_s=10)
    assert [m["MessageAttributes"]["requeued_by"]["StringValue"] for m in moved] == ["bob", "bob"]
    assert count(backend.endpoint_url, queues.dlq_url) == 4
    code, _, err = run_cli(capsys, "dlq", "requeue", "--reason", "r")
    assert code == 2
    code, _, err = run_cli(capsys, "dlq", "requeue", "--category", "bgu", "--reason", "r")  # a typo: not a success
    assert (code, err.strip()) == (3, "no dead letters of category 'bgu'")
    assert count(backend.endpoint_url, queues.dlq_url) == 4


def test_purge_needs_yes(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    fill(backend, queues)
    code, _, err = run_cli(capsys, "dlq", "purge")
    assert code == 2
    assert "--yes" in err
    assert count(backend.endpoint_url, queues.dlq_url) == 6
    code, out, _ = run_cli(capsys, "dlq", "purge", "--yes")
    assert code == 0
    assert "purged" in out
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.dlq_url)


class FailSecondEntry:
    """A real SQS client whose SendMessageBatch reports entry "1" as failed (a partial batch failure)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        keep = [e for e in Entries if e["Id"] != "1"]
        response: dict[str, Any] = self._client.send_message_batch(QueueUrl=QueueUrl, Entries=keep) if keep else {}
        failed = [{"Id": "1", "Code": "InternalError", "Message": "simulated", "SenderFault": False}]
        return {"Successful": response.get("Successful", []), "Failed": failed}


def test_nothing_leaves_the_dlq_without_landing(backend: Backend, queues: Created) -> None:
    fill(backend, queues)
    client = FailSecondEntry(sqs_client(backend.endpoint_url))
    dlq = DeadLetterQueue(client, dlq_url=queues.dlq_url, source_url=queues.queue_url)  # type: ignore[arg-type]
    result = redrive_by_receiving(dlq, limiter=RateLimiter(None), snapshot=dlq.snapshot())
    landed = drain(backend.endpoint_url, queues.queue_url, expect=result.moved, timeout_s=10)
    assert result.failed
    assert len(landed) == result.moved
    assert result.moved + len(result.failed) == 6
    # The failed ones are still in the DLQ (released again), not lost.
    assert count(backend.endpoint_url, queues.dlq_url) == len(result.failed)


def test_a_missing_source_queue_moves_nothing(backend: Backend, queues: Created) -> None:
    fill(backend, queues)
    client = sqs_client(backend.endpoint_url)
    missing = queues.queue_url.rsplit("/", 1)[0] + f"/missing-{uuid.uuid4().hex[:8]}"
    dlq = DeadLetterQueue(client, dlq_url=queues.dlq_url, source_url=missing)
    result = redrive_by_receiving(dlq, limiter=RateLimiter(None), snapshot=dlq.snapshot())
    assert result.moved == 0
    assert result.failed
    assert count(backend.endpoint_url, queues.dlq_url) == 6
