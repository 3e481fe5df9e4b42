"""JSON logs: fields, formats, redaction of secrets wherever they appear, one line per job state change."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from worker.observability.events import Event, Kind
from worker.observability.logs import REDACTED, LogObserver, Redactor, configure_logging, event_fields
from worker.settings import WorkerSettings

SECRET = "hunter2-very-secret"


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_line_has_the_standard_and_extra_fields(log_stream: io.StringIO) -> None:
    logging.getLogger("worker").info("job %s done", "x1", extra={"job_type": "send_email", "attempt": 2})
    [line] = lines(log_stream)
    assert line["message"] == "job x1 done"
    assert line["level"] == "INFO"
    assert line["logger"] == "worker"
    assert line["job_type"] == "send_email"
    assert line["attempt"] == 2
    assert line["timestamp"].endswith("Z")
    assert "T" in line["timestamp"]


def test_adapter_extras_of_the_job_logger_are_rendered(log_stream: io.StringIO) -> None:
    adapter = logging.LoggerAdapter(logging.getLogger("worker.job"), {"job_type": "t", "message_id": "m-1"})
    adapter.warning("careful")
    [line] = lines(log_stream)
    expected = ("worker.job", "t", "m-1", "WARNING")
    assert (line["logger"], line["job_type"], line["message_id"], line["level"]) == expected


def test_unserialisable_extra_values_become_text(log_stream: io.StringIO) -> None:
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    logging.getLogger("worker").info("x", extra={"thing": Thing(), "nested": {"deep": [1, Thing()]}})
    [line] = lines(log_stream)
    assert line["thing"] == "a thing"
    assert line["nested"] == {"deep": [1, "a thing"]}


def test_text_format(log_stream: io.StringIO) -> None:
    stream = io.StringIO()
    configure_logging(WorkerSettings(queue="q", log_format="text"), stream=stream)
    logging.getLogger("worker").info("hello", extra={"job_type": "t", "password": SECRET})
    text = stream.getvalue()
    assert "INFO worker: hello" in text
    assert 'job_type="t"' in text
    assert SECRET not in text
    assert REDACTED in text


def test_configure_logging_twice_keeps_one_handler(log_stream: io.StringIO) -> None:
    configure_logging(WorkerSettings(queue="q"), stream=log_stream)
    logging.getLogger("worker").info("once")
    assert [line["message"] for line in lines(log_stream)] == ["once"]


# --------------------------------------------------------------------------------------------- redaction

TEXT_CASES = [
    (f'{{"password": "{SECRET}", "user": "bob"}}', '{"password": "[REDACTED]", "user": "bob"}'),
    (f"{{'password': '{SECRET}', 'user': 'bob'}}", "{'password': '[REDACTED]', 'user': 'bob'}"),
    (f"login password={SECRET} user=bob", "login password=[REDACTED] user=bob"),
    (f"db_password: {SECRET}; next", "db_password: [REDACTED]; next"),
    (f"Authorization: Bearer {SECRET}", "Authorization: [REDACTED]"),
    ('"api_key":12345678,"n":1', '"api_key":[REDACTED],"n":1'),
    (f'PASSWORD="{SECRET} with space" tail', 'PASSWORD="[REDACTED]" tail'),
    (f"https://x/?token={SECRET}&page=2", "https://x/?token=[REDACTED]&page=2"),
    ("nothing secret here: user=bob", "nothing secret here: user=bob"),
]


@pytest.mark.parametrize(("text", "expected"), TEXT_CASES)
def test_redact_text(text: str, expected: str) -> None:
    redactor = Redactor(["password", "secret", "token", "authorization", "api_key"])
    assert redactor.redact_text(text) == expected


def test_redact_structures_at_any_depth() -> None:
    redactor = Redactor(["password", "secret"])
    value = {"user": "bob", "auth": {"Password": SECRET, "items": [{"client_secret": "abcd1234"}]}, "n": 3}
    assert redactor.redact(value) == {
        "user": "bob",
        "auth": {"Password": REDACTED, "items": [{"client_secret": REDACTED}]},
        "n": 3,
    }


def test_a_redacted_value_is_scrubbed_where_it_shows_up_unkeyed_later() -> None:
    redactor = Redactor(["password"])
    redactor.redact({"password": SECRET})
    assert redactor.redact_text(f"ValueError: rejected {SECRET}!") == f"ValueError: rejected {REDACTED}!"


def test_longer_secrets_are_replaced_before_their_prefixes() -> None:
    redactor = Redactor(["password"])
    redactor.redact({"password": "abcd"})
    redactor.redact({"password": "abcd-efgh-ijkl"})
    assert redactor.redact_text("x abcd-efgh-ijkl y") == f"x {REDACTED} y"


def test_no_fields_means_no_redaction() -> None:
    redactor = Redactor([])
    assert redactor.redact_text("password=x") == "password=x"
    assert redactor.redact({"password": "x"}) == {"password": "x"}


def test_secret_in_extra_message_and_traceback_is_redacted(log_stream: io.StringIO) -> None:
    payload = {"user": "bob", "password": SECRET}
    try:
        raise RuntimeError(f"login failed with {payload}; retried with {SECRET}")
    except RuntimeError:
        logging.getLogger("worker").exception("job failed: %s", payload, extra={"payload": payload})
    output = log_stream.getvalue()
    assert SECRET not in output
    [line] = lines(log_stream)
    assert line["payload"] == {"user": "bob", "password": REDACTED}
    assert "RuntimeError" in line["exception"]
    assert "Traceback" in line["exception"]


# --------------------------------------------------------------------------------------------- events


def test_log_observer_writes_one_line_per_state_change(log_stream: io.StringIO) -> None:
    observer = LogObserver(logging.getLogger("worker.events"))
    kinds = [Kind.RECEIVED, Kind.STARTED, Kind.RETRY_SCHEDULED, Kind.STARTED, Kind.SUCCEEDED]
    for kind in kinds:
        observer.emit(Event(kind=kind, queue="q", message_id="m-1", job_type="send_email", attempt=1, duration_s=0.25))
    observer.gauge(in_flight=1, free_slots=3)
    records = lines(log_stream)
    assert [r["event"] for r in records] == [k.value for k in kinds]
    assert {r["message_id"] for r in records} == {"m-1"}
    assert records[2]["level"] == "WARNING"
    assert records[-1]["duration_s"] == 0.25


def test_dead_letter_line_carries_category_and_error_and_no_nones() -> None:
    event = Event(
        kind=Kind.DEAD_LETTERED,
        queue="q",
        message_id="m",
        job_type="t",
        attempt=5,
        category="exhausted",
        error="TimeoutError: slow",
    )
    fields = event_fields(event)
    assert fields["category"] == "exhausted"
    assert fields["error"] == "TimeoutError: slow"
    assert "delay_s" not in fields
    assert "reason" not in fields


def test_connectivity_is_logged_on_change_only(log_stream: io.StringIO) -> None:
    observer = LogObserver()
    observer.connectivity(service="sqs", reachable=False)
    observer.connectivity(service="sqs", reachable=False)
    observer.connectivity(service="sqs", reachable=True)
    assert [(r["level"], r["event"]) for r in lines(log_stream)] == [("WARNING", "unreachable"), ("INFO", "reachable")]


def test_the_first_call_answering_is_not_logged(log_stream: io.StringIO) -> None:
    observer = LogObserver()
    observer.connectivity(service="sqs", reachable=True)
    observer.connectivity(service="sqs", reachable=False)
    observer.connectivity(service="sqs", reachable=True)
    assert [(r["level"], r["event"]) for r in lines(log_stream)] == [("WARNING", "unreachable"), ("INFO", "reachable")]
