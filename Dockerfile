# syntax=docker/dockerfile:1
# sqs-worker: the worker as a container. Build: docker build -t sqs-worker .
# Run (read-only root, /tmp as tmpfs for the liveness file):
#   docker run --read-only --tmpfs /tmp -e WORKER_QUEUE=jobs -e WORKER_HANDLERS=myapp.jobs -e AWS_REGION=eu-west-1 sqs-worker
# See docs/container.md.

# uv, pinned to the version that wrote uv.lock; only its binary is copied out.
FROM ghcr.io/astral-sh/uv:0.13.8 AS uv

# Builder: install the locked runtime dependencies (no dependency groups; the dashboard extra, so the image can
# run `sqs-worker dashboard`) and the worker into /opt/venv.
FROM python:3.11.14-slim-bookworm AS builder
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON=/usr/local/bin/python3.11 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1
WORKDIR /src
# Dependencies first, in their own layer: rebuilt only when the lock changes.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-default-groups --extra dashboard --extra uvloop --no-editable --no-install-project
COPY worker ./worker
RUN uv sync --frozen --no-default-groups --extra dashboard --extra uvloop --no-editable \
    && /opt/venv/bin/sqs-worker --help >/dev/null

# Runtime: the same base as the builder (the venv links its Python), the venv alone, a non-root numeric user.
FROM python:3.11.14-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 worker \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin worker
COPY --from=builder /opt/venv /opt/venv
# PYTHONPATH=/app: handler modules copied or mounted into /app import by name (WORKER_HANDLERS=myapp.jobs).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WORKER_HEALTH_FILE=/tmp/sqs-worker-health
WORKDIR /app
USER 10001:10001
# The worker handles SIGTERM itself (stop receiving, let running jobs finish within WORKER_SHUTDOWN_GRACE_S,
# release the rest); give `docker stop -t` / terminationGracePeriodSeconds more than that grace.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["sqs-worker", "health", "--check"]
ENTRYPOINT ["sqs-worker"]
CMD ["run"]
