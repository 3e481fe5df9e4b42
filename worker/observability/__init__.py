"""Logs, metrics (EMF, CloudWatch, Prometheus), health endpoints and the observer fan-out."""
