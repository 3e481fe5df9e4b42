"""The dlq commands against hostile dead letters and odd input: one short answer, never a traceback, the DLQ
untouched; and the embedded local AWS's answer to an action moto lacks."""

from __future__ import annotations

import json
import logging

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.support.backends import Backend
from tests.test_dlq import count, dead_letter, run_cli
from worker.commands.__main__ import main
from worker.dev.localaws import LocalAws
from worker.ops import dlq_records
from worker.ops.bootstrap import Created
from worker.ops.dlq_records import DeadLetter, format_groups, group_dead_letters

pytestmark = pytest.mark.usefixtures("restore_logging")

#: The worker dead-letters this as invalid_message (nesting deeper than 100); json.loads hits the recursion limit.
DEEP = '{"type":"send_email","payload":{"d":' + "[" * 10_000 + "]" * 10_000 + "}}"
#: JSON escapes of lone surrogates (LocalStack refuses raw control characters in bodies; escapes are plain text).
SURROGATES = '{"type":"\\udfff\\ud800","payload":{}}'
#: A valid envelope whose type holds a terminal escape sequence and a C1 control character.
ESCAPES = '{"type":"x\\u001b[2J\\u009by","payload":{}}'


def _letter(body: str) -> DeadLetter:
    return DeadLetter(message_id="m", receipt_handle="rh", body=body, attributes={}, system={})


def test_hostile_bodies_are_not_envelopes_and_print_safely() -> None:
    assert _letter(DEEP).job_type is None
    assert _letter(SURROGATES).job_type is None
    assert _letter('{"type":"n","payload":{"n":' + "9" * 5000 + "}}").job_type is None
    assert _letter(ESCAPES).job_type == "x\x1b[2J\x9by"
    table = format_groups(group_dead_letters([_letter(ESCAPES)]), read=1, approximate_total=1)
    assert "\x1b" not in table and "\x9b" not in table
    assert "x\\x1b[2J\\x9by" in table
    assert dlq_records.printable("a\udfff\x00b") == "a\\udfff\\x00b"
    assert dlq_records.printable("evil\u202e\u2066x") == "evil\\u202e\\u2066x"  # bidi controls cannot reorder the line
    assert json.loads(dlq_records.printable_json({"t": "a\u202eb"})) == {"t": "a\u202eb"}
    assert "\u202e" not in dlq_records.printable_json({"t": "a\u202eb"})
    # invisible characters show where they stand; joiners that shape a script or an emoji sequence stay
    assert dlq_records.printable("send\u200bemail\ufeff") == "send\\u200bemail\\ufeff"
    assert dlq_records.printable("a\u200db\u00ad\u2028") == "a\\u200db\\xad\\u2028"
    family, hindi = "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u0915\u094d\u200d\u0937"
    assert dlq_records.printable(family) == family and dlq_records.printable(hindi) == hindi
    assert dlq_records.printable("\u200d\U0001f468") == "\\u200d\U0001f468"  # at an end it joins nothing
    assert dlq_records.escape_bidi("line\nzero\u200bwidth") == "line\nzero\\u200bwidth"
    assert json.loads(dlq_records.printable_json({"t": "a\u200bb"})) == {"t": "a\u200bb"}
    assert "\u200b" not in dlq_records.printable_json({"t": "a\u200bb"})
    text = dlq_records.printable_json({"body": "é\udfff\x9b\x07"})
    text.encode("utf-8")  # no lone surrogate left
    assert "é" in text
    assert json.loads(text) == {"body": "é\udfff\x9b\x07"}  # the same JSON value


def test_a_deeply_nested_dead_letter_lists_and_shows(
    backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]
) -> None:
    ident = dead_letter(
        backend.endpoint_url,
        queues.dlq_url,
        DEEP,
        category="invalid_message",
        error="body nests deeper than 100 levels",
    )
    code, out, err = run_cli(capsys, "dlq", "list")
    assert code == 0, err
    assert "invalid_message" in out and "(not an envelope)" in out
    code, out, err = run_cli(capsys, "dlq", "list", "--json")
    assert code == 0, err
    assert json.loads(out)["groups"][0]["job_types"] == {"(not an envelope)": 1}
    code, out, err = run_cli(capsys, "dlq", "show", ident)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["body"] == DEEP
    assert shown["job_type"] is None
    assert count(backend.endpoint_url, queues.dlq_url) == 1


@pytest.mark.parametrize("body", [SURROGATES, ESCAPES], ids=["lone-surrogates", "control-characters"])
def test_a_dead_letter_with_unprintable_text_lists_and_shows(
    backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    ident = dead_letter(backend.endpoint_url, queues.dlq_url, body, category="invalid_message", error="x")
    code, out, err = run_cli(capsys, "dlq", "list")
    assert code == 0, err
    assert "invalid_message" in out
    assert not any(ch in out for ch in "\x1b\x9b\ud800\udfff")
    code, out, err = run_cli(capsys, "dlq", "list", "--json")
    assert code == 0, err
    json.loads(out)
    code, out, err = run_cli(capsys, "dlq", "show", ident)
    assert code == 0, err
    assert not any(ch in out for ch in "\x1b\x9b\ud800\udfff")
    assert json.loads(out)["body"] == body
    assert count(backend.endpoint_url, queues.dlq_url) == 1


def test_requeue_of_an_unknown_id_says_so(
    backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "dlq", "requeue", "abc", "--reason", "r")
    assert code == 1
    assert "no dead letter with id abc" in err
    assert "stay in the dead-letter queue" not in err
    assert "requeued" not in out


@pytest.mark.parametrize("argv", [["status"], ["stats"], ["health"], ["dlq"], ["dlq", "list"], ["schedules"]])
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    assert "``" not in out


def test_redrive_fallback_is_said_once(backend: Backend, queues: Created, capsys: pytest.CaptureFixture[str]) -> None:
    if backend.name != "moto":
        pytest.skip("only moto lacks StartMessageMoveTask")
    for _ in range(2):
        dead_letter(backend.endpoint_url, queues.dlq_url, '{"type":"x","payload":{}}', category="bug", error="e")
    code, out, err = run_cli(capsys, "dlq", "redrive", "--yes")
    assert code == 0, err
    assert "moved 2 of 2 by receive-send-delete" in out
    assert err.count("StartMessageMoveTask") == 1, err
    assert err.count("2/2 moved") == 1, err


def test_an_action_moto_lacks_is_one_unretried_501_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with LocalAws() as aws:
        sqs = boto3.client(
            "sqs",
            endpoint_url=aws.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="a",
            aws_secret_access_key="a",
        )
        sent: list[str] = []
        sqs.meta.events.register("before-send.sqs.StartMessageMoveTask", lambda **_: sent.append("try"))
        url = sqs.create_queue(QueueName="lacks")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        with caplog.at_level(logging.INFO, logger="werkzeug"), pytest.raises(ClientError) as raised:
            sqs.start_message_move_task(SourceArn=arn, DestinationArn=arn)
    assert sent == ["try"]
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
    assert raised.value.response["Error"]["Code"] == "UnsupportedOperation"
    assert "not been implemented" in raised.value.response["Error"]["Message"]
    assert "Traceback" not in caplog.text
