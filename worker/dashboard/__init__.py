"""``sqs-worker dashboard``: queues, dead letters, jobs, schedules and workers on a web page.

- ``config``: its settings (``WORKER_DASHBOARD_*``); ``security``: who may look and act (token, ALB OIDC, CSRF).
- ``sources``: the reads and actions (``worker.ops`` underneath); ``history``: what it samples while it runs.
- ``app``: the Starlette app and its pages; ``serve``: uvicorn, standalone or beside ``sqs-worker dev``.

Needs the ``dashboard`` extra (Starlette, uvicorn, Jinja2); uPlot is vendored under ``static/uplot``.
"""
