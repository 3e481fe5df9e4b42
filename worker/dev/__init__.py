"""`sqs-worker dev`: the embedded local AWS, its server and the example handlers."""
