"""Google Cloud Tasks: the same ``@job`` handlers behind a push queue (WORKER_BACKEND=cloudtasks).

- ``settings``: WORKER_CLOUDTASKS_* (project, location, URL, auth, dead-letter table, the queue's max attempts).
- ``contract``: the HTTP contract (pure): headers in, status codes out.
- ``auth``: OIDC tokens of Cloud Tasks (Google's keys, cached) or a shared secret header.
- ``runner``: one delivery through the worker's execution path (prepare, ledger, call_handler, classify_failure).
- ``deadletters``: the DynamoDB dead-letter table the worker writes (Cloud Tasks has no DLQ).
- ``server``: ``sqs-worker serve-tasks`` (Starlette on uvicorn), health and graceful shutdown.
- ``producer``: tasks created with ``google-cloud-tasks`` (name from the idempotency key, schedule time).
- ``dlq``: the ``dlq`` commands on the dead-letter table.

Needs the ``gcp`` extra: ``pip install "sqs-worker[gcp] @ ..."``.
"""
