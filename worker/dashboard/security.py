"""Who may see the dashboard and act through it (pure, apart from the request objects it reads).

- Bound to a loopback address (the default, 127.0.0.1) it trusts whoever can reach it: the local user.
- Bound anywhere else it needs ``WORKER_DASHBOARD_TOKEN`` (sent as ``Authorization: Bearer <token>``, or once
  as ``?token=<token>``, which sets an HttpOnly cookie), or ``WORKER_DASHBOARD_TRUST_ALB_OIDC=true`` behind an
  ALB that authenticates users with OIDC (the user is its ``x-amzn-oidc-identity`` header); else it refuses to
  start. A request without the right token gets 401.
- Every POST carries a CSRF token (a hidden form field, an HMAC of the user under a per-process secret); a POST
  without it, or with another user's, gets 403. Actions (POSTs) answer 403 unless ``WORKER_DASHBOARD_ACTIONS``.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from worker.errors import ConfigError

TOKEN_COOKIE = "sqs_worker_dashboard"  # noqa: S105 - a cookie name, not a secret
OIDC_IDENTITY_HEADER = "x-amzn-oidc-identity"
CSRF_FIELD = "csrf"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(*, host: str, token: str | None, trust_alb_oidc: bool) -> None:
    """A ConfigError when the dashboard would listen beyond loopback with nobody checking who asks."""
    if not is_loopback(host) and not token and not trust_alb_oidc:
        raise ConfigError(
            f"the dashboard host {host} (--host or WORKER_DASHBOARD_HOST) is reachable from other hosts: "
            "set WORKER_DASHBOARD_TOKEN "
            "(or WORKER_DASHBOARD_TRUST_ALB_OIDC=true behind an ALB that authenticates users)"
        )


def local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


@dataclass(frozen=True)
class Gate:
    """The dashboard's access rules, from its settings."""

    token: str | None
    trust_alb_oidc: bool
    actions_enabled: bool
    secret: bytes

    @classmethod
    def create(cls, *, token: str | None, trust_alb_oidc: bool, actions_enabled: bool) -> Gate:
        return cls(token or None, trust_alb_oidc, actions_enabled, secrets.token_bytes(32))

    def identify(self, headers: Mapping[str, str], cookies: Mapping[str, str], query_token: str | None) -> str | None:
        """The user a request comes from, or None (401). With a token set every request needs it, also behind an
        ALB (its OIDC header then only names the user): a header anyone can send never replaces the token."""
        identity = headers.get(OIDC_IDENTITY_HEADER, "").strip() if self.trust_alb_oidc else ""
        if self.token is not None:
            offered = _bearer(headers.get("authorization", "")) or cookies.get(TOKEN_COOKIE) or query_token
            if not (offered and hmac.compare_digest(offered.encode(), self.token.encode())):
                return None
            return f"oidc:{identity[:200]}" if identity else "token"
        if self.trust_alb_oidc:
            return f"oidc:{identity[:200]}" if identity else None
        return local_user()

    def csrf_token(self, user: str) -> str:
        return hmac.new(self.secret, user.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, user: str, offered: str | None) -> bool:
        return bool(offered) and hmac.compare_digest(str(offered), self.csrf_token(user))

    def notice_signature(self, text: str) -> str:
        """The signature a redirect's notice ("Requeued 3 ...") carries: a page shows only notices it wrote, not
        the text of any link someone sends."""
        return hmac.new(self.secret, b"notice\0" + text.encode("utf-8", "replace"), hashlib.sha256).hexdigest()

    def notice_ok(self, text: str, offered: str | None) -> bool:
        return bool(offered) and hmac.compare_digest(str(offered), self.notice_signature(text))


def _bearer(value: str) -> str | None:
    scheme, _, credentials = value.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None
