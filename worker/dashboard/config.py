"""The dashboard's settings: the worker's (``WORKER_*``) plus its own ``WORKER_DASHBOARD_*`` variables."""

from __future__ import annotations

from pydantic import Field, SecretStr

from worker.settings import WorkerSettings


class DashboardSettings(WorkerSettings):
    """``sqs-worker dashboard`` reads these besides the worker's settings."""

    dashboard_host: str = Field(
        default="127.0.0.1", description="Address to listen on; anything but loopback needs a token or ALB OIDC."
    )
    dashboard_port: int = Field(default=8181, ge=0, le=65_535, description="Port to listen on (0: any free one).")
    dashboard_token: SecretStr | None = Field(default=None, description="Bearer token every request must carry.")
    dashboard_trust_alb_oidc: bool = Field(
        default=False, description="Trust the x-amzn-oidc-identity header of an ALB that authenticates users."
    )
    dashboard_actions: bool = Field(
        default=False, description="Allow redrive, requeue, purge and fire now (else the dashboard is read-only)."
    )
    dashboard_sample_s: float = Field(
        default=5.0, gt=0, allow_inf_nan=False, le=60, description="How often the overview samples."
    )
