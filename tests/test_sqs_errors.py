"""Translating botocore failures at the SQS edge: what no retry can fix stops the worker, the rest is retried."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from worker import ConfigError, QueueUnavailable
from worker.aws import translate


def client_error(code: str, status: int) -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}
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
