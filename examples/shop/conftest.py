"""Puts this folder on the import path (pytest does so for the folder of a conftest.py), so ``import shop``
works from the repository's test run as from this folder. The ``sqs_worker`` fixture comes from sqs-worker's
pytest plugin: nothing to configure."""
