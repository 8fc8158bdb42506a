"""Who may read the report pages: a bearer token, required off loopback.

Reports quote log lines; on a shared network they are not for everyone. With a token
(``RETRO_WEB_TOKEN``, or ``RETRO_WEB_TOKEN_FILE`` naming a mounted Secret's file)
the report pages and their JSON answer only requests that carry it:

- ``Authorization: Bearer <token>`` (curl, scripts, dashboards), or
- ``?token=<token>`` once in a browser: the answer sets an HttpOnly, SameSite=Strict
  cookie so the page's own refreshes and links carry it from then on.

``/livez``, ``/healthz`` and ``/metrics`` stay open: kubelet probes and Prometheus
scrape without credentials, and they reveal no log content. A worker bound to a
non-loopback address refuses to start without a token.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from pathlib import Path

from streams.errors import ConfigError
from streams.settings import Settings

COOKIE = "retro_token"
OPEN_PATHS = frozenset({"/livez", "/healthz", "/metrics"})


def web_token(settings: Settings) -> str | None:
    """The token the pages require, or None when they are open (loopback only).

    Raises ConfigError for a non-loopback ``RETRO_WEB_HOST`` without a token, or a
    token file that cannot be read or is empty.
    """
    token = settings.web_token.get_secret_value() if settings.web_token else None
    if settings.web_token_file is not None:
        token = _read_token_file(settings.web_token_file)
    if token is not None:
        token = token.strip()
        if not token:
            raise ConfigError("the web token (RETRO_WEB_TOKEN / RETRO_WEB_TOKEN_FILE) is "
                              "empty; set one, e.g. `openssl rand -hex 32`")
        return token
    if not is_loopback(settings.web_host):
        raise ConfigError(
            f"RETRO_WEB_HOST={settings.web_host} serves report pages (log lines) beyond this "
            "machine: set RETRO_WEB_TOKEN or RETRO_WEB_TOKEN_FILE (a mounted Secret), or "
            "RETRO_WEB_HOST=127.0.0.1")
    return None


def _read_token_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"RETRO_WEB_TOKEN_FILE={path}: cannot read it "
                          f"({exc.strerror or exc})") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def authorized(token: str, *, headers: Mapping[str, str], query: Mapping[str, str],
               cookies: Mapping[str, str]) -> bool:
    """Whether a request carries ``token`` (header, query or cookie), compared in
    constant time."""
    offered = []
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        offered.append(value.strip())
    offered += [query.get("token", ""), cookies.get(COOKIE, "")]
    expected = token.encode()
    return any(o and hmac.compare_digest(o.encode(), expected) for o in offered)
