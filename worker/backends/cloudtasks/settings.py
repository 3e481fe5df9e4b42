"""The Cloud Tasks backend's settings: ``WORKER_CLOUDTASKS_*`` variables (or ``.env`` lines), one class.

``WORKER_BACKEND=cloudtasks`` (in :class:`worker.settings.WorkerSettings`) selects the backend; the queue is still
``WORKER_QUEUE`` (the Cloud Tasks queue id, e.g. ``jobs``), its project and location come from here.
"""

from __future__ import annotations

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.errors import ConfigError

#: Google's signing keys of the ID tokens it issues (what Cloud Tasks sends).
GOOGLE_JWKS_URL = "https://www.googleapis.com/oauth2/v3/certs"
#: The issuers Google's ID tokens carry.
GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")


class CloudTasksSettings(BaseSettings):
    """Everything the Cloud Tasks backend reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="WORKER_CLOUDTASKS_", env_file=".env", extra="ignore")

    project: str | None = Field(default=None, description="Google Cloud project id of the queue.")
    location: str | None = Field(default=None, description="The queue's location, e.g. europe-west1.")
    url: str | None = Field(default=None, description="URL tasks are POSTed to (the serve-tasks service).")
    max_attempts: int = Field(
        default=100, ge=1, description="The queue's retryConfig.maxAttempts (Cloud Tasks' default is 100)."
    )
    dead_letter_table: str | None = Field(default=None, description="DynamoDB table of the dead-letter records.")
    port: int = Field(default=8080, ge=0, le=65_535, description="Port serve-tasks listens on (Cloud Run: $PORT).")
    # all interfaces: Cloud Tasks (through Cloud Run) reaches the container from outside
    host: str = Field(default="0.0.0.0", description="Address serve-tasks listens on.")  # noqa: S104  # nosec B104
    audience: str | None = Field(default=None, description="Expected OIDC audience (default: the url setting).")
    service_account: str | None = Field(
        default=None, description="Service account whose OIDC tokens are accepted (the token's email claim)."
    )
    jwks_url: str = Field(default=GOOGLE_JWKS_URL, description="Where Google's signing keys are fetched from.")
    jwks_cache_s: int = Field(default=3600, ge=0, description="How long fetched signing keys are kept.")
    shared_secret: str | None = Field(
        default=None, min_length=16, description="Accept requests with this X-Worker-Secret header (local use)."
    )
    emulator_host: str | None = Field(
        default=None, description="host:port of a local Cloud Tasks emulator (insecure gRPC, no credentials)."
    )
    dispatch_deadline_s: int = Field(
        default=1800,  # Cloud Tasks' most: above the default timeout_s (900), so default jobs are not retried mid-run
        ge=15,
        le=1800,
        description="How long Cloud Tasks waits for an answer (HTTP targets: 15 s-30 min).",
    )
    dead_letter_write_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="How long a request keeps trying to write its dead-letter record.",
    )

    def queue_path(self, queue: str) -> str:
        """``projects/P/locations/L/queues/Q`` of ``queue`` (a bare id, or already a full path)."""
        if queue.startswith("projects/"):
            return queue
        if not self.project or not self.location:
            raise ConfigError(
                "WORKER_CLOUDTASKS_PROJECT and WORKER_CLOUDTASKS_LOCATION must be set (or a full "
                "queue path projects/P/locations/L/queues/Q in WORKER_QUEUE)"
            )
        return f"projects/{self.project}/locations/{self.location}/queues/{queue}"

    def expected_audience(self) -> str:
        audience = self.audience or self.url
        if not audience:
            raise ConfigError("WORKER_CLOUDTASKS_AUDIENCE (or WORKER_CLOUDTASKS_URL) must be set to check OIDC tokens")
        return audience


def load_cloudtasks_settings(**overrides: object) -> CloudTasksSettings:
    """Read the settings, turning validation errors into one ConfigError line naming the variables."""
    try:
        return CloudTasksSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        parts = []
        for error in exc.errors():
            field = ".".join(str(loc) for loc in error["loc"])
            name = f"WORKER_CLOUDTASKS_{field.upper()}" if field else "WORKER_CLOUDTASKS_*"
            parts.append(f"{name}: {error['msg']}")
        raise ConfigError("invalid settings: " + "; ".join(parts)) from None
