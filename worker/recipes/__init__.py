"""Ready-made jobs, each usable as is (``WORKER_HANDLERS=worker.recipes.webhook``) and as an example to copy.

- ``webhook``: signed HTTP POST deliveries with receiver-friendly retries, and ``verify`` for receivers.
- ``email``: templated SMTP mail, sent once per recipient, template and event.
- ``report``: a report built by a group of chunk jobs, assembled into S3, served by a presigned URL.

Each module registers its job types on import and has a ``register(registry, **options)`` for another registry.
"""
