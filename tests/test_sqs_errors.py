"""The edge's one error table (worker.backends.aws): what no retry can fix stops with one line naming it, the rest is
retried within its budget; error pages never leak into a line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from worker import ConfigError, LedgerUnavailable, QueueUnavailable
from worker.backends.aws import Trouble, call_with_budget, classify, describe, is_transient, translate
from worker.budgets import Budget

HTML_500 = (
    "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n<h1>Internal Server Error</h1>\n"
    "<p>The server encountered an internal error and was unable to complete your request.</p>\n"
)


def client_error(code: str, status: int, message: str = "m") -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "Op")


@pytest.mark.parametrize(
    ("error", "expected", "fragment"),
    [
        (client_error("AWS.SimpleQueueService.NonExistentQueue", 400), ConfigError, "sqs-worker bootstrap"),
        (client_error("AccessDenied", 403), ConfigError, "access denied"),
        (client_error("InvalidClientTokenId", 403), ConfigError, "credentials"),
        (client_error("ExpiredToken", 400), QueueUnavailable, "ExpiredToken"),
        (client_error("ThrottlingException", 400), QueueUnavailable, "Throttling"),
        (client_error("InternalError", 500), QueueUnavailable, "InternalError"),
        (client_error("SomethingNew", 400), QueueUnavailable, "SomethingNew"),
        (
            EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
            QueueUnavailable,
            "cannot reach SQS at http://127.0.0.1:9",
        ),
    ],
)
def test_translate(error: Exception, expected: type[Exception], fragment: str) -> None:
    translated = translate(error, "ReceiveMessage")
    assert type(translated) is expected
    assert fragment in str(translated)


@pytest.mark.parametrize(
    ("error", "trouble"),
    [
        (EndpointConnectionError(endpoint_url="http://x"), Trouble.UNREACHABLE),
        (ConnectTimeoutError(endpoint_url="http://x"), Trouble.UNREACHABLE),
        (ReadTimeoutError(endpoint_url="http://x"), Trouble.UNREACHABLE),
        (ConnectionRefusedError(), Trouble.UNREACHABLE),
        (TimeoutError(), Trouble.UNREACHABLE),
        (NoCredentialsError(), Trouble.CREDENTIALS),
        (client_error("UnrecognizedClientException", 400), Trouble.CREDENTIALS),
        (client_error("SignatureDoesNotMatch", 403), Trouble.CREDENTIALS),
        (client_error("AccessDeniedException", 400), Trouble.ACCESS),
        (client_error("QueueDoesNotExist", 400), Trouble.MISSING),
        (client_error("ResourceNotFoundException", 400), Trouble.MISSING),
        (client_error("ProvisionedThroughputExceededException", 400), Trouble.TRANSIENT),
        (client_error("500", 500, HTML_500), Trouble.TRANSIENT),
        (client_error("Whatever", 429), Trouble.TRANSIENT),
        (client_error("InvalidParameterValue", 400), Trouble.REFUSED),
        (client_error("ConditionalCheckFailedException", 400), Trouble.REFUSED),
        (ValueError("not an AWS error"), Trouble.REFUSED),
    ],
)
def test_classify(error: BaseException, trouble: Trouble) -> None:
    assert classify(error) is trouble
    assert is_transient(error) is (trouble in (Trouble.UNREACHABLE, Trouble.TRANSIENT))


def test_an_html_error_page_is_one_short_line() -> None:
    error = client_error("500", 500, HTML_500)
    assert describe(error) == "HTTP 500 (Internal Server Error)"
    line = str(translate(error, "StartMessageMoveTask"))
    page = "a web page, not an AWS answer: check AWS_ENDPOINT_URL"
    assert line == f"StartMessageMoveTask failed: HTTP 500 (Internal Server Error), {page}"
    at = translate(
        client_error("404", 404, HTML_500.replace("500 Internal Server Error", "404 Not Found")),
        "GetItem",
        service="dynamodb",
        endpoint="http://127.0.0.1:8080",
    )
    assert str(at) == f"GetItem refused: HTTP 404 (Not Found) from http://127.0.0.1:8080, {page}"
    # The JSON protocol drops an HTML body and keeps the status line's reason: the same line.
    assert describe(client_error("500", 500, "Internal Server Error")) == "HTTP 500 (Internal Server Error)"
    long_text = client_error("InvalidParameterValue", 400, "x " * 500 + "\n second line")
    assert "\n" not in describe(long_text)
    assert len(describe(long_text)) <= 200


def test_names_the_queue_table_and_endpoint() -> None:
    missing = client_error("AWS.SimpleQueueService.NonExistentQueue", 400)
    line = str(translate(missing, "GetQueueUrl", resource="jobs", endpoint="http://127.0.0.1:4566"))
    assert "queue 'jobs' does not exist at http://127.0.0.1:4566" in line
    table = translate(client_error("ResourceNotFoundException", 400), "GetItem", service="dynamodb", resource="t1")
    assert isinstance(table, ConfigError)
    assert "table 't1' does not exist" in str(table)
    down = translate(EndpointConnectionError(endpoint_url="http://h:1"), "GetItem", service="dynamodb")
    assert isinstance(down, LedgerUnavailable)
    assert "cannot reach DynamoDB at http://h:1" in str(down)
    denied = translate(client_error("AccessDenied", 403, "User x is not authorized"), "SendMessage", resource="jobs")
    assert "access denied on 'jobs' (AccessDenied: User x is not authorized)" in str(denied)
    assert "AWS_ACCESS_KEY_ID" in str(translate(NoCredentialsError(), "GetQueueUrl"))


FAST = Budget("test", first_delay_s=0.001, max_delay_s=0.002, give_up_after_s=0.05, then="raise")


class Flaky:
    """A client call failing ``failures`` times with ``error``, then answering."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error = error
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_call_with_budget_retries_transient_failures() -> None:
    flaky = Flaky(EndpointConnectionError(endpoint_url="http://x"), failures=3)
    assert asyncio.run(call_with_budget(flaky, budget=FAST)) == "ok"
    assert flaky.calls == 4


def test_call_with_budget_gives_up_when_spent_and_never_retries_the_rest() -> None:
    down = Flaky(client_error("ServiceUnavailable", 503), failures=10**6)
    with pytest.raises(ClientError):
        asyncio.run(call_with_budget(down, budget=FAST))
    assert 2 < down.calls < 1000
    refused = Flaky(client_error("AccessDenied", 403), failures=10**6)
    with pytest.raises(ClientError):
        asyncio.run(call_with_budget(refused, budget=FAST))
    assert refused.calls == 1
