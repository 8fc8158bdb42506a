"""Redaction: every kind is caught, and the evidence a post-mortem needs survives."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.redact import Redactor, is_card_number, luhn_ok, placeholder

from helpers import shared_file

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAvRpJ3tY6bq1Gk0FQ1lWc5Z2b0fF4M8l8yT6R\n"
    "q9cM0xXh0m7yWcN1eQ2l2mDqQ==\n"
    "-----END RSA PRIVATE KEY-----"
)


@pytest.fixture(scope="module")
def r() -> Redactor:
    return Redactor()


# --- every kind ------------------------------------------------------------------


def test_private_key_block_is_replaced_whole_across_lines(r: Redactor) -> None:
    text, counts = r.redact(f"loaded key\n{PEM}\nthen started")
    assert text == f"loaded key\n{placeholder('private_key')}\nthen started"
    assert counts == {"private_key": 1}


def test_unterminated_private_key_is_redacted_to_the_end(r: Redactor) -> None:
    text, counts = r.redact("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA")
    assert text == placeholder("private_key")
    assert counts == {"private_key": 1}


def test_certificate_is_public_and_kept(r: Redactor) -> None:
    cert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----"
    assert r.redact(cert) == (cert, {})


def test_jwt(r: Redactor) -> None:
    text, counts = r.redact(f"[getToken][success][USER TOKEN: {JWT} USER ID: 42]")
    assert text == f"[getToken][success][USER TOKEN: {placeholder('jwt')} USER ID: 42]"
    assert counts == {"jwt": 1}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("Authorization: Bearer abc.def-123", "Authorization: Bearer [REDACTED:bearer_token]"),
        ("sent Bearer xyz to upstream", "sent Bearer [REDACTED:bearer_token] to upstream"),
        ("authorization: bearer abc", "authorization: bearer [REDACTED:bearer_token]"),
        (
            "token type bearer 0123456789abcdefghijKLMN",
            "token type bearer [REDACTED:bearer_token]",
        ),
    ],
)
def test_bearer_token(r: Redactor, line: str, expected: str) -> None:
    text, counts = r.redact(line)
    assert text == expected
    assert counts == {"bearer_token": 1}


def test_bearer_jwt_counts_once_as_jwt(r: Redactor) -> None:
    text, counts = r.redact(f'-H "Authorization: Bearer {JWT}"')
    assert text == '-H "Authorization: Bearer [REDACTED:jwt]"'
    assert counts == {"jwt": 1}


def test_the_word_bearer_in_prose_is_kept(r: Redactor) -> None:
    assert r.redact("the bearer of bad news") == ("the bearer of bad news", {})


@pytest.mark.parametrize(
    "key",
    [
        "sk-" + "A1b2C3d4" * 6,
        "sk-proj-" + "Ab3_-xY9" * 12,
        "AKIAIOSFODNN7EXAMPLE",
        "ASIAY34FZKBOKMUTVV7A",
        "ghp_" + "a1B2c3D4e5" * 4,
        "github_pat_11ABCDEFG0123456789_abcdefghijKLMNOPQRSTUVWXYZ",
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp",
        "AIzaSyD-1234567890abcdefghijklmnopqrstu",
        "glpat-xxxxxxxxxxxxxxxxxxxx",
    ],
)
def test_api_keys_with_known_prefixes(r: Redactor, key: str) -> None:
    text, counts = r.redact(f"using key {key} for upload")
    assert text == "using key [REDACTED:api_key] for upload"
    assert counts == {"api_key": 1}


@pytest.mark.parametrize(
    ("line", "expected", "kind"),
    [
        ("api_key=abc123def", "api_key=[REDACTED:api_key]", "api_key"),
        ("apikey: 9f8e7d6c", "apikey: [REDACTED:api_key]", "api_key"),
        ("X-Api-Key: zzz123", "X-Api-Key: [REDACTED:api_key]", "api_key"),
        (
            "user=bob password=s3cr3t! next",
            "user=bob password=[REDACTED:password] next",
            "password",
        ),
        ("db.passwd = hunter2", "db.passwd = [REDACTED:password]", "password"),
        ("pwd:letmein", "pwd:[REDACTED:password]", "password"),
        ("client_secret=abc&grant=x", "client_secret=[REDACTED:secret]&grant=x", "secret"),
        ("refreshToken: r-123", "refreshToken: [REDACTED:secret]", "secret"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUt", "AWS_SECRET_ACCESS_KEY=[REDACTED:api_key]", "api_key"),
        (
            "authorization: Basic dXNlcjpwYXNz",
            "authorization: Basic [REDACTED:password]",
            "password",
        ),
    ],
)
def test_key_value_pairs(r: Redactor, line: str, expected: str, kind: str) -> None:
    text, counts = r.redact(line)
    assert text == expected
    assert counts == {kind: 1}


def test_json_pairs_keep_the_quotes_and_other_fields(r: Redactor) -> None:
    line = '{"user":"bob","password":"p@ss\\"w0rd","token": "t-1", "n": 3}'
    text, counts = r.redact(line)
    assert text == (
        '{"user":"bob","password":"[REDACTED:password]","token": "[REDACTED:secret]", "n": 3}'
    )
    assert counts == {"password": 1, "secret": 1}


def test_json_escaped_inside_a_string(r: Redactor) -> None:
    line = '{"log": "body={\\"password\\":\\"abc def\\"}"}'
    text, counts = r.redact(line)
    assert text == '{"log": "body={\\"password\\":\\"[REDACTED:password]\\"}"}'
    assert counts == {"password": 1}


@pytest.mark.parametrize(
    "line",
    [
        "password: ****",
        "token=null",
        "password=",
        '"password": ""',
        "num_tokens=512 max_tokens: 1024",
        "bypass=true",
        "Token: Token { kind: ContainerToken, service: 172.22.149.145:28345 }",
    ],
)
def test_key_value_pairs_with_nothing_secret_are_kept(r: Redactor, line: str) -> None:
    assert r.redact(line) == (line, {})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgres://admin:hunter2@db.example.com:5432/app",
            "postgres://admin:[REDACTED:password]@db.example.com:5432/app",
        ),
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://:[REDACTED:password]@10.0.0.5:6379/0"),
        (
            "https://user:p%40ss@host.internal/path?q=1",
            "https://user:[REDACTED:password]@host.internal/path?q=1",
        ),
    ],
)
def test_url_password_keeps_user_and_host(r: Redactor, url: str, expected: str) -> None:
    text, counts = r.redact(f"connecting to {url} now")
    assert text == f"connecting to {expected} now"
    assert counts == {"password": 1}


@pytest.mark.parametrize(
    "url", ["http://example.com:8080/path", "ssh://git@github.com/org/repo", "http://a:b"]
)
def test_urls_without_password_are_kept(r: Redactor, url: str) -> None:
    assert r.redact(url) == (url, {})


def test_email(r: Redactor) -> None:
    text, counts = r.redact("mail bob.smith+ops@example.co.uk and ALICE@Corp.IO now")
    assert text == "mail [REDACTED:email] and [REDACTED:email] now"
    assert counts == {"email": 2}


@pytest.mark.parametrize(
    "line",
    [
        "LeaseRenewer:msrabi@msra-sa-41:9000",  # user@host, no domain
        "java.lang.Object@6d06d69c",  # identity hash
        "QuorumCnxManager$SendWorker@679",
    ],
)
def test_at_signs_that_are_not_emails(r: Redactor, line: str) -> None:
    assert r.redact(line) == (line, {})


@pytest.mark.parametrize(
    "card",
    [
        "4111111111111111",
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "5500 0000 0000 0004",
        "3400 000000 00009",
        "6011000000000004",
        "2221000000000009",
    ],
)
def test_card_numbers(r: Redactor, card: str) -> None:
    text, counts = r.redact(f"charged card={card} ok")
    assert text == "charged card=[REDACTED:card_number] ok"
    assert counts == {"card_number": 1}


def test_luhn() -> None:
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")
    assert is_card_number("4111-1111-1111-1111")
    assert not is_card_number("4111111111111112")  # Luhn fails
    assert not is_card_number("1117838570123453")  # Luhn passes but no issuer starts with 1


# --- evidence survives -----------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "PacketResponder 0 for block blk_-6952295868487656571 terminating",
        "Receiving block blk_38865049064139660 src: /10.251.73.220:50010 dest: /10.251.73.22:5001",
        "BLOCK* ask 10.250.14.38:50010 to delete blk_-4794867979917102672 blk_1724757848743533110",
        "- 1117838570 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 RAS KERNEL INFO",
        "OrderId: 81e395e3-e2be-46a4-870d-9c775433c0bd TraceID: c0adbf0be7377f7e909723dd70512670",
        "ts=1700000000123 ns=1700000000123456789 at 2026-01-02T03:04:05.678Z",
        "compact 20260102030405678 offset 4111111111111111111111",  # too long for a card
        "v4.1111111111111111 and 12345678-1234-1234-1234-123456789012",
        "container_1445144423722_0020_01_000012 on 172.22.149.145:28345",
    ],
)
def test_ids_ips_uuids_timestamps_survive(r: Redactor, line: str) -> None:
    assert r.redact(line) == (line, {})


@pytest.mark.parametrize("name", ["HDFS", "BGL", "Zookeeper", "OpenStack"])
def test_loghub_files_have_nothing_to_redact(r: Redactor, name: str) -> None:
    path = shared_file("loghub", name, f"{name}_2k.log")
    found = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        text, counts = r.redact(line)
        if counts or text != line:
            found[line] = counts
    assert found == {}


def test_real_jwts_in_trainticket_logs_are_redacted(r: Redactor) -> None:
    path = shared_file("nezha-trainticket", "trainticket-2023-01-29-0927.docker-json.log")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if "USER TOKEN: eyJ" in ln]
    assert lines, "the file no longer has the token lines this test is about"
    for line in lines:
        text, counts = r.redact(line)
        assert counts.get("jwt") == 1
        assert "eyJ" not in text


# --- mappings --------------------------------------------------------------------


def test_mapping_sensitive_keys_replaced_whole_and_recursive(r: Redactor) -> None:
    attrs = {
        "user": "bob",
        "password": {"old": "a", "new": "b"},
        "headers": {"Authorization": "Bearer abc123", "X-Api-Key": "k-1", "Accept": "*/*"},
        "db": [{"url": "mysql://app:pw@db:3306/x", "clientSecret": 12345}],
        "contact": "ops@example.com",
        "tokens": 512,
        "card": 4111111111111111,
        "retries": 3,
    }
    original = repr(attrs)
    out, counts = r.redact_mapping(attrs)
    assert out == {
        "user": "bob",
        "password": "[REDACTED:password]",
        "headers": {
            "Authorization": "[REDACTED:bearer_token]",
            "X-Api-Key": "[REDACTED:api_key]",
            "Accept": "*/*",
        },
        "db": [
            {
                "url": "mysql://app:[REDACTED:password]@db:3306/x",
                "clientSecret": "[REDACTED:secret]",
            }
        ],
        "contact": "[REDACTED:email]",
        "tokens": 512,
        "card": "[REDACTED:card_number]",
        "retries": 3,
    }
    assert counts == {
        "password": 2,
        "bearer_token": 1,
        "api_key": 1,
        "secret": 1,
        "email": 1,
        "card_number": 1,
    }
    assert repr(attrs) == original  # input untouched


def test_mapping_empty_sensitive_values_are_not_counted(r: Redactor) -> None:
    attrs = {"password": None, "token": "", "secret": "****", "pass": True}
    assert r.redact_mapping(attrs) == (attrs, {})


# --- properties ------------------------------------------------------------------


def _luhn_complete(body: str) -> str:
    for check in "0123456789":
        if luhn_ok(body + check):
            return body + check
    raise AssertionError("unreachable")


@given(st.text(alphabet="0123456789", min_size=14, max_size=14))
def test_any_visa_like_number_is_redacted(body: str) -> None:
    card = _luhn_complete("4" + body)
    text, counts = Redactor().redact(f"pay {card} now")
    assert text == "pay [REDACTED:card_number] now"
    assert counts == {"card_number": 1}


@given(st.ip_addresses(v=4), st.uuids(), st.integers(min_value=0, max_value=2**63))
def test_ips_uuids_and_block_ids_never_change(ip: object, u: uuid.UUID, blk: int) -> None:
    line = f"from /{ip}:50010 id={u} blk_-{blk} blk_{blk}"
    assert Redactor().redact(line) == (line, {})


@given(st.sampled_from([PEM, JWT, "password=x1", "a@b.example", "4111111111111111"]), st.text())
def test_redaction_is_idempotent(secret: str, noise: str) -> None:
    r = Redactor()
    once, _ = r.redact(f"{noise} {secret} {noise}")
    assert r.redact(once) == (once, {})


# --- no catastrophic backtracking ------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "text",
    [
        "x=" + "aB1." * 16_000 + " token",  # was exponential in an earlier key pattern
        "token " + "aB" * 32_000,
        "key " + "a_" * 32_000 + "!",
        'password="' + 'a\\"' * 20_000,
        "1234 " * 13_000,
        "4111-" * 13_000,
        "@a" * 32_000,
        "http://" + "a:" * 32_000,
        "eyJ" * 20_000,
        "-----BEGIN RSA PRIVATE KEY-----" + "a" * 64_000,
    ],
)
def test_pathological_64kb_records_stay_fast(r: Redactor, text: str) -> None:
    start = time.perf_counter()
    r.redact(text)
    assert time.perf_counter() - start < 1.0  # measured: under 20 ms each


# --- secrets with no key name: found by their shape ------------------------------------
AWS_SECRET = "Zk3vQ9xLm2Pq8Rt5Wy7Bn4Cd6Fg1Hj0KsTu2Ve/"  # 40 chars, base64 alphabet


@pytest.mark.parametrize("line", [
    f"new secret {AWS_SECRET} rotated",
    f"rotated to {AWS_SECRET}",
    "webhook signing value sk_live_4eC39HqLyjWDarjtT1zdp7dc accepted",
    "session cPNj8KZHiezDsMckWU4AFGG-F1IE8RGSQaG8yoUwXOU opened",
    "blob 3q2+7wAAAAFkZXZpY2VJZDpBQkMxMjM0NTY3ODk= attached",
])
def test_random_looking_tokens_without_a_key_name_are_redacted(r: Redactor, line: str) -> None:
    out, counts = r.redact(line)
    assert "[REDACTED:opaque_token]" in out, out
    assert counts == {"opaque_token": 1}
    assert out.split()[0] == line.split()[0]  # the words around it stay


@pytest.mark.parametrize("token", [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # sha256
    "9fceb02d0ae598e95dc970b74767f19372d61af8",  # git SHA
    str(uuid.UUID(int=0x1234567890ABCDEF1234567890ABCDEF)),
    "DFSClient_NONMAPREDUCE_1537864556_1",
    "AbstractHttp11Processor2Handler",
    "getRequestDispatcherForwardIncludeAttributes",
    "retro-stream-clean-7d9f8b6c5d-x2x4z",
    "/home/spelce1/HPCC_IBM/Urgent/VNM/64K/vnm",
    "blk_-6952295868487656571",
    "ORG_APACHE_HADOOP_HDFS_SERVER_DATANODE",
])
def test_ids_hashes_paths_and_names_are_not_secrets(r: Redactor, token: str) -> None:
    line = f"INFO processed {token} in 12 ms"
    assert r.redact(line) == (line, {})


def test_most_random_tokens_are_caught_whatever_their_length() -> None:
    import random
    import string

    from streams.redact import looks_random

    rng = random.Random(11)
    alphabet = string.ascii_letters + string.digits + "+/"
    for n in (20, 40, 64):
        tokens = ["".join(rng.choice(alphabet) for _ in range(n)) for _ in range(500)]
        caught = sum(looks_random(t) for t in tokens) / len(tokens)
        assert caught >= 0.93, (n, caught)


def test_the_allow_list_keeps_tokens_the_user_names_as_ids() -> None:
    request_id = "req_2Nf8aQx9Lm3Kp7ZtW4"
    line = f"request {request_id} used {AWS_SECRET}"
    out, _ = Redactor().redact(line)
    assert request_id not in out and AWS_SECRET not in out
    out, counts = Redactor(allow=[r"req_[A-Za-z0-9]{16,}"]).redact(line)
    assert request_id in out and AWS_SECRET not in out and counts == {"opaque_token": 1}
    assert Redactor(opaque_tokens=False).redact(line) == (line, {})


def test_the_allow_list_setting_is_checked_and_reaches_the_cleaner() -> None:
    from pydantic import ValidationError

    from streams.clean.cleaner import Cleaner
    from streams.records import NormalizedRecord, RawCoord
    from streams.settings import CleanSettings, Settings

    with pytest.raises(ValidationError, match="not a regular expression"):
        CleanSettings(redact_allow=("req_[",))
    # the variable takes one regex as it is, or a JSON list
    assert CleanSettings(redact_allow=r"req_\w+").redact_allow == (r"req_\w+",)
    assert CleanSettings(redact_allow='["a+", "b{2}"]').redact_allow == ("a+", "b{2}")
    with pytest.raises(ValidationError, match="JSON list"):
        CleanSettings(redact_allow='["req_\\w+"')
    settings = Settings(clean=CleanSettings(redact_allow=(r"req_\w+",)))
    [out] = Cleaner.from_settings(settings).clean(
        f"2026-11-28T10:00:00Z INFO req_2Nf8aQx9Lm3Kp7ZtW4 key {AWS_SECRET}".encode(),
        RawCoord(topic="raw", partition=0, offset=1), "app")
    assert isinstance(out, NormalizedRecord)
    assert "req_2Nf8aQx9Lm3Kp7ZtW4" in out.message and AWS_SECRET not in out.message


def test_a_remembered_text_gives_its_own_counts_each_time(r: Redactor) -> None:
    first, counts = r.redact("password=hunter2")
    counts["password"] = 99  # a caller adds to the counts it gets
    again, counts_again = r.redact("password=hunter2")
    assert again == first and "hunter2" not in again
    assert counts_again == {"password": 1}


def test_the_memo_is_bounded(r: Redactor, monkeypatch: pytest.MonkeyPatch) -> None:
    import streams.redact as module

    monkeypatch.setattr(module, "MEMO_TEXTS", 3)
    for i in range(10):
        text = f"user {i} password=abc{i}"
        assert r.redact(text) == (f"user {i} password=[REDACTED:password]", {"password": 1})
    assert len(r._memo) <= 3


_HEX_TEXT = st.text(alphabet="0123456789abcdefABCDEF-", min_size=1, max_size=80)


@given(st.one_of(
    _HEX_TEXT,
    st.uuids().map(str),
    st.builds(lambda body, rest: _luhn_complete("4" + body) + rest,
              st.text(alphabet="0123456789", min_size=14, max_size=14), _HEX_TEXT),
    st.builds("-".join, st.lists(st.text(alphabet="0123456789", min_size=4, max_size=6),
                                 min_size=2, max_size=5)),
))
def test_a_hex_id_is_redacted_as_every_rule_would(text: str) -> None:
    """Hex ids skip the rules (no rule finds anything in one but a card number at its
    start): the same text and counts as running every rule, cards at the start included."""
    r = Redactor()
    assert r.redact(text) == r._redact(text)
    assert r.redact_mapping({"trace_id": text, "card": text}) == (
        {"trace_id": r._redact(text)[0], "card": r._redact(text)[0]},
        {k: 2 * n for k, n in r._redact(text)[1].items()})


def test_a_card_number_written_as_a_hex_id_is_still_redacted() -> None:
    text, counts = Redactor().redact("4111-1111-1111-1111")
    assert text == "[REDACTED:card_number]" and counts == {"card_number": 1}
