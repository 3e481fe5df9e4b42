"""Benchmarks of sqs-worker (not part of the installed package): see benchmarks/README.md."""
