"""The report pages' bearer token: when it is required, how it is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from streams.errors import ConfigError
from streams.settings import Settings
from streams.worker.web_auth import COOKIE, authorized, is_loopback, web_token


def test_loopback_needs_no_token_and_any_other_address_refuses_to_start() -> None:
    assert web_token(Settings(web_host="127.0.0.1")) is None
    assert web_token(Settings(web_host="::1")) is None
    for host in ("0.0.0.0", "10.1.2.3", "::", "retro.internal", ""):
        with pytest.raises(ConfigError, match="RETRO_WEB_TOKEN"):
            web_token(Settings(web_host=host))


def test_the_token_comes_from_the_setting_or_a_mounted_secret_file(tmp_path: Path) -> None:
    assert web_token(Settings(web_host="0.0.0.0", web_token=SecretStr("s3cret"))) == "s3cret"
    secret = tmp_path / "token"
    secret.write_text("from-file\n")  # a Secret's file may end in a newline
    assert web_token(Settings(web_host="0.0.0.0", web_token_file=secret)) == "from-file"
    with pytest.raises(ConfigError, match="cannot read"):
        web_token(Settings(web_token_file=tmp_path / "missing"))
    secret.write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        web_token(Settings(web_token_file=secret))


def test_a_request_is_authorized_by_header_query_or_cookie_only_with_the_exact_token() -> None:
    def ok(headers=None, query=None, cookies=None) -> bool:
        return authorized("t0k3n", headers=headers or {}, query=query or {},
                          cookies=cookies or {})

    assert ok(headers={"Authorization": "Bearer t0k3n"})
    assert ok(headers={"Authorization": "bearer t0k3n"})
    assert ok(query={"token": "t0k3n"})
    assert ok(cookies={COOKIE: "t0k3n"})
    assert not ok()
    assert not ok(headers={"Authorization": "Bearer t0k3"})
    assert not ok(headers={"Authorization": "Basic t0k3n"})
    assert not ok(query={"token": ""}, cookies={COOKIE: "nope"})


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
