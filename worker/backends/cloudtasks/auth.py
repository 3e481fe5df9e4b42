"""Who may run jobs through ``serve-tasks``: Cloud Tasks' OIDC token, or a shared secret for local use.

- OIDC: ``Authorization: Bearer <ID token>``, an RS256 JWT signed by one of Google's keys (fetched from the JWKS
  URL and cached), issued by ``https://accounts.google.com``, for the configured audience, whose ``email`` is the
  configured service account (``email_verified`` true), not expired.
- Shared secret: ``X-Worker-Secret: <WORKER_CLOUDTASKS_SHARED_SECRET>`` (compared in constant time).

Anything else raises :class:`Unauthorized` (the server answers 401 and runs nothing). Keys that cannot be fetched
raise :class:`KeysUnavailable` (503: the caller is not at fault, Cloud Tasks tries again).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import jwt

from worker.backends.cloudtasks.settings import GOOGLE_ISSUERS, CloudTasksSettings
from worker.errors import ConfigError, WorkerError

log = logging.getLogger("worker.cloudtasks")

SECRET_HEADER_NAME = "X-Worker-Secret"  # noqa: S105 - a header name, not a secret
SECRET_HEADER = SECRET_HEADER_NAME.lower()
#: An unknown key id refetches the key set at most this often (a flood of forged kids cannot flood Google).
MIN_REFRESH_INTERVAL_S = 30.0
FETCH_TIMEOUT_S = 10.0
#: After a failed fetch, none for this long (without keys, requests are answered 503 at once meanwhile).
RETRY_AFTER_FAILURE_S = 10.0
#: Clock skew allowed on exp / iat / nbf.
LEEWAY_S = 30


class Unauthorized(WorkerError):
    """A request without valid credentials; says what is wrong, never the token."""


class KeysUnavailable(WorkerError):
    """Google's signing keys cannot be had (never fetched, the endpoint unreachable): not the caller's fault."""


class KeySet:
    """Google's signing keys by key id, fetched from ``url`` and kept ``cache_s``; refetched for an unknown key
    id at most every MIN_REFRESH_INTERVAL_S. ``fetch`` (blocking, run in a thread) returns the JWKS document.

    One fetch at a time, shared by every request that needs it (ten deliveries waiting for slow keys wait for one
    fetch, not ten in a row); after a failed fetch none is tried for RETRY_AFTER_FAILURE_S (meanwhile, without
    keys, a request is refused at once with KeysUnavailable)."""

    def __init__(
        self,
        url: str,
        *,
        cache_s: float,
        fetch: Callable[[str], Mapping[str, Any]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.cache_s = cache_s
        self._fetch = fetch or fetch_jwks
        self._monotonic = monotonic
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None
        self._failed_at: float | None = None
        self._failure = ""
        self._inflight: asyncio.Future[None] | None = None

    async def key(self, kid: str) -> Any:
        if self._due(kid):
            await self._refresh()
        key = self._keys.get(kid)
        if key is None:
            if not self._keys:
                raise KeysUnavailable(f"signing keys unavailable from {self.url}: {self._failure}")
            raise Unauthorized(f"token signed with an unknown key id {kid[:64]!r}")
        return key

    def _due(self, kid: str) -> bool:
        """Whether to fetch (or join the fetch under way) before looking ``kid`` up."""
        if self._inflight is not None:
            return True
        now = self._monotonic()
        if self._failed_at is not None and now - self._failed_at < RETRY_AFTER_FAILURE_S:
            return False
        if self._fetched_at is None or now - self._fetched_at > self.cache_s:
            return True
        return kid not in self._keys and now - self._fetched_at > MIN_REFRESH_INTERVAL_S

    async def _refresh(self) -> None:
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._fetch_once())
            self._inflight.add_done_callback(self._fetch_ended)
        await asyncio.shield(self._inflight)  # a request that goes away leaves the fetch to the others

    def _fetch_ended(self, fetch: asyncio.Future[None]) -> None:
        self._inflight = None
        if not fetch.cancelled():
            fetch.exception()  # retrieved here too: a fetch no request awaits any more logs no warning

    async def _fetch_once(self) -> None:
        try:
            document = await asyncio.to_thread(self._fetch, self.url)
            keys = jwt.PyJWKSet.from_dict(dict(document)).keys
        except Exception as exc:
            self._failed_at, self._failure = self._monotonic(), str(exc)
            if not self._keys:
                raise KeysUnavailable(f"signing keys unavailable from {self.url}: {exc}") from None
            log.warning("could not refresh the signing keys from %s, keeping the cached ones: %s", self.url, exc)
            return
        self._keys = {key.key_id: key.key for key in keys if key.key_id}
        self._fetched_at, self._failed_at = self._monotonic(), None


def fetch_jwks(url: str) -> Mapping[str, Any]:
    if not url.startswith(("https://", "http://")):
        raise ValueError("the JWKS URL must be http(s)")
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310  # nosec B310
        document = json.load(response)
    if not isinstance(document, dict):
        raise ValueError("the JWKS document is not a JSON object")
    return document


class Authenticator:
    """Checks a request's headers (lower-case names) against the settings' OIDC and shared-secret rules."""

    def __init__(self, settings: CloudTasksSettings, *, keys: KeySet | None = None) -> None:
        if settings.service_account is None and settings.shared_secret is None:
            raise ConfigError(
                "set WORKER_CLOUDTASKS_SERVICE_ACCOUNT (accept Cloud Tasks' OIDC tokens) or "
                "WORKER_CLOUDTASKS_SHARED_SECRET (local use): serve-tasks never runs unauthenticated requests"
            )
        self.service_account = settings.service_account
        self.audience = settings.expected_audience() if settings.service_account else None
        self._secret = settings.shared_secret.encode() if settings.shared_secret else None
        self.keys = keys or KeySet(settings.jwks_url, cache_s=settings.jwks_cache_s)

    async def check(self, headers: Mapping[str, str]) -> str:
        """Who sent the request (the service account, or ``shared-secret``); raises Unauthorized."""
        secret = headers.get(SECRET_HEADER)
        if secret is not None and self._secret is not None:
            if hmac.compare_digest(secret.encode("utf-8", "surrogateescape"), self._secret):
                return "shared-secret"
            raise Unauthorized("wrong shared secret")
        authorization = headers.get("authorization", "")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                "no credentials: expected an OIDC bearer token"
                + (" or the X-Worker-Secret header" if self._secret else "")
            )
        if self.service_account is None:
            raise Unauthorized("OIDC tokens are not accepted: WORKER_CLOUDTASKS_SERVICE_ACCOUNT is not set")
        return await self.verify_token(token.strip())

    async def verify_token(self, token: str) -> str:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"malformed token: {exc}") from None
        if header.get("alg") != "RS256":
            raise Unauthorized(f"token algorithm {str(header.get('alg'))[:16]!r} is not RS256")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise Unauthorized("token without a key id")
        key = await self.keys.key(kid)
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=["RS256"],
                audience=self.audience,
                issuer=GOOGLE_ISSUERS,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"token rejected: {exc}") from None
        if claims.get("email") != self.service_account or claims.get("email_verified") is not True:
            raise Unauthorized("token is not for the configured service account (email claim)")
        return str(self.service_account)
