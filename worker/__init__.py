"""sqs-worker."""
