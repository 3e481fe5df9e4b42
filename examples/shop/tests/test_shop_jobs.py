"""The shop's handlers, tested without AWS: the real worker over sqs-worker's in-memory queue."""

import pytest
from shop.jobs import BUSY, OUTBOX, make_thumbnail, send_receipt
from shop.models import Receipt

from worker.errors import ConfigError
from worker.testing import InMemoryWorker


@pytest.fixture(autouse=True)
def empty_outbox() -> None:
    OUTBOX.clear()
    BUSY.clear()


def test_a_receipt_is_sent_once_and_a_bad_address_is_dead_lettered(sqs_worker: InMemoryWorker) -> None:
    send_receipt.enqueue(Receipt(order_id="o-1", email="ada@example.com", total_cents=1999))
    send_receipt.enqueue(Receipt(order_id="o-2", email="bob@mail.invalid", total_cents=500))
    send_receipt.enqueue(Receipt(order_id="o-1", email="ada@example.com", total_cents=1999))  # sent twice

    result = sqs_worker.run_until_idle()

    assert result.succeeded == 1
    assert result.duplicates_skipped == 1
    [dead] = result.dead_letters
    assert dead.category == "permanent"
    assert dead.payload["order_id"] == "o-2"
    assert OUTBOX == [("ada@example.com", "Order o-1: 19.99 EUR")]  # once, whatever the duplicates


def test_a_busy_store_is_retried_after_its_delay_at_once(sqs_worker: InMemoryWorker) -> None:
    BUSY.add("cat.png")
    make_thumbnail.enqueue({"image": "cat.png", "width": 1024, "height": 768})

    result = sqs_worker.run_until_idle()

    assert (result.succeeded, result.retried, result.dead_lettered) == (1, 1, 0)
    assert result.skipped_s > 25  # the retry's 30 s delay: skipped, not waited


def test_an_invalid_payload_is_refused_before_sending(sqs_worker: InMemoryWorker) -> None:
    with pytest.raises(ConfigError, match="total_cents"):
        send_receipt.enqueue({"order_id": "o-3", "email": "ada@example.com"})
    assert sqs_worker.counts().total == 0


def test_a_handler_is_a_plain_function() -> None:
    assert make_thumbnail({"image": "wide.png", "width": 1000, "height": 500}) == {"width": 128, "height": 64}
