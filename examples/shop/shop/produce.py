"""Send the shop's jobs: ``python -m shop.produce`` (to WORKER_QUEUE at the endpoint of the AWS variables).

A producer imports the payload models only, never the handlers: ``job_ref`` names the job and its model.
"""

from shop.models import Receipt
from worker.enqueue import job_ref

send_receipt = job_ref("send_receipt", Receipt)
make_thumbnail = job_ref("make_thumbnail")


def main() -> None:
    first = send_receipt.enqueue(Receipt(order_id="o-1", email="ada@example.com", total_cents=1999))
    print("receipt:", first)
    print("thumbnail:", make_thumbnail.enqueue({"image": "cat.png", "width": 1024, "height": 768}))
    batch = send_receipt.enqueue_many(
        Receipt(order_id=f"o-{n}", email=f"customer{n}@example.com", total_cents=100 * n) for n in range(2, 14)
    )
    print(f"batch: {sum(1 for mid in batch.message_ids if mid)} sent, {len(batch.failures)} refused")


if __name__ == "__main__":
    main()
