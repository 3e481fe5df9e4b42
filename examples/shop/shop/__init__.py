"""The example app of sqs-worker: a shop that mails receipts and makes thumbnails in the background."""
