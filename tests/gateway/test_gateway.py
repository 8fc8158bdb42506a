"""Gateway: retries, splits, repair, cache and exact coverage, against a scripted backend."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from streams.batch.prompt import cache_key, extract_payload
from streams.batch.window import Batch, build_batch
from streams.errors import (
    ConfigError,
    ContextTooLong,
    PermanentModelError,
    RateLimited,
    TransientModelError,
)
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import ChatBackend, ChatRequest, ChatResult, HandlerBackend
from streams.gateway.buckets import TokenBucket
from streams.gateway.cache import MemoryCache
from streams.gateway.caller import ModelCaller
from streams.gateway.gateway import Gateway
from streams.gateway.retry import RetryBudget
from streams.gateway.telemetry import LaneMetrics
from streams.intervals import Coverage
from streams.metrics import Metrics
from streams.records import BatchOutcome, NormalizedRecord
from streams.tokens import TokenCalibration

from helpers import FakeClock, WordCounter, make_record

COUNTER = WordCounter()


def make_records(
    n: int, *, templates: int = 3, first_offset: int = 0, partition: int = 0
) -> list[NormalizedRecord]:
    """``n`` ERROR records cycling through ``templates`` templates of two services."""
    return [
        make_record(
            first_offset + i,
            message=f"event {i % templates} from node {i % 5}",
            service=("hdfs", "yarn")[i % templates % 2],
            template_id=f"t{i % templates}",
            template=f"event {i % templates} from node <*>",
            seconds=i,
            level="ERROR",
            partition=partition,
        )
        for i in range(n)
    ]


def make_batch(n: int = 12, **kwargs: Any) -> Batch:
    return build_batch(
        make_records(n, **kwargs),
        lane="fast",
        counter=COUNTER,
        max_example_tokens=None,
        trigger="budget",
    )


def good_answer(payload: dict[str, Any]) -> dict[str, Any]:
    """One fragment per service, naming every ref once."""
    by_service: dict[str, list[str]] = {}
    for g in payload["groups"]:
        by_service.setdefault(g["service"], []).append(g["ref"])
    return {
        "fragments": [
            {
                "refs": refs,
                "service": service,
                "event": f"{service} kept failing",
                "cause": "a node is down",
                "suggestion": "restart the node",
                "severity": "high",
            }
            for service, refs in by_service.items()
        ]
    }


def respond(action: str, messages: list[dict[str, Any]]) -> ChatResult:
    payload = extract_payload(messages)
    answer = good_answer(payload)
    if action == "ok":
        return ChatResult(json.dumps(answer), "stop", 1234, 50)
    if action == "missing":
        last = payload["groups"][-1]["ref"]
        for item in answer["fragments"]:
            item["refs"] = [r for r in item["refs"] if r != last]
        answer["fragments"] = [f for f in answer["fragments"] if f["refs"]]
        return ChatResult(json.dumps(answer), "stop", 1234, 40)
    if action == "length":
        return ChatResult(json.dumps(answer)[:30], "length", 1234, 300)
    if action == "malformed":
        return ChatResult("Sure! Here is what I found: the nodes are down.", "stop", 1234, 12)
    if action == "unknown_ref":
        answer["fragments"][0]["refs"].append("g999")
        return ChatResult(json.dumps(answer), "stop", 1234, 50)
    if action == "429":
        raise RateLimited("429 from provider", retry_after=2.0)
    if action == "429-bare":
        raise RateLimited("429 from provider")
    if action == "500":
        raise TransientModelError("500 from provider", reason="server_error")
    if action == "timeout":
        raise TransientModelError("timed out", reason="timeout")
    if action == "context":
        raise ContextTooLong("maximum context length exceeded")
    if action == "rejected":
        raise PermanentModelError("400 bad request", reason="model_rejected")
    raise AssertionError(f"unknown action {action}")


def scripted(
    script: Sequence[str] = (),
    *,
    default: str = "ok",
    chooser: Callable[[], str] | None = None,
) -> HandlerBackend:
    """A provider playing a script of outcomes, one per request, then ``default`` (or a
    chooser's pick)."""
    actions = list(script)

    async def play(request: ChatRequest) -> ChatResult:
        action = actions.pop(0) if actions else chooser() if chooser else default
        await asyncio.sleep(0)
        return respond(action, request.messages)

    return HandlerBackend(play)


class SpyLimiter(AIMDLimiter):
    """Remembers the priority of every acquisition."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.priorities: list[int] = []

    def slot(self, priority: int = 0) -> Any:
        self.priorities.append(priority)
        return super().slot(priority)


def make_gateway(
    backend: ChatBackend,
    *,
    time: FakeClock | None = None,
    limiter: AIMDLimiter | None = None,
    budget: RetryBudget | None = None,
    cache: MemoryCache | None = None,
    metrics: Metrics | None = None,
    calibration: TokenCalibration | None = None,
    tpm_capacity: float | None = None,
    seed: int = 0,
) -> Gateway:
    t = time or FakeClock()
    caller = ModelCaller(
        backend=backend,
        model="test-model",
        timeout_seconds=30.0,
        # pause 0: the limiter's own pause is covered in test_aimd with a patched loop clock
        limiter=limiter or SpyLimiter(start=4, maximum=8, pause_seconds=0.0),
        rpm=TokenBucket(rate_per_minute=600, clock=t, sleep=t.sleep),
        tpm=TokenBucket(
            rate_per_minute=1_000_000,
            capacity=tpm_capacity,
            clock=t,
            sleep=t.sleep,
            setting="RETRO_MODEL__TPM",
        ),
        retry_budget=budget or RetryBudget(),
        max_attempts=3,
        backoff_base=1.0,
        calibration=calibration,
        telemetry=LaneMetrics(metrics, "fast"),
        sleep=t.sleep,
        rng=random.Random(seed),
    )
    return Gateway(caller, prompt_version="v1", detail="brief", context_window=8192,
                   output_reserve=0.3, cache=cache)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def assert_exact_cover(batch: Batch, outcome: BatchOutcome) -> None:
    """Every record of the batch is in exactly one fragment or review."""
    pieces = [Coverage.from_json(f.covered) for f in outcome.fragments]
    pieces += [Coverage.from_json(r.covered) for r in outcome.reviews]
    union = Coverage()
    for piece in pieces:
        assert not union.intersection(piece), "a record is covered twice"
        union = union.union(piece)
    assert union == batch.coverage
    assert sum(len(p) for p in pieces) == batch.record_count
    ids = [i for r in outcome.reviews for i in r.record_ids]
    assert len(ids) == len(set(ids))


# --- the happy path ---------------------------------------------------------------


async def test_success_is_one_call_with_fragments_covering_the_batch() -> None:
    backend = scripted()
    metrics = Metrics()
    gateway = make_gateway(backend, metrics=metrics)
    batch = make_batch(12)
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 1 and outcome.reviews == []
    assert {f.service for f in outcome.fragments} == {"hdfs", "yarn"}
    assert_exact_cover(batch, outcome)
    assert backend.requests[0].max_tokens >= 256
    assert sample(metrics, "retro_model_requests_total", lane="fast", status="ok") == 1
    assert sample(metrics, "retro_fragments_total", lane="fast") == 2
    assert sample(metrics, "retro_model_tokens_total", lane="fast", kind="prompt") == 1234
    assert sample(metrics, "retro_model_requests_in_flight", lane="fast") == 0
    assert gateway.limiter.limit == 5  # +1 for the success


async def test_reported_prompt_tokens_feed_the_calibration() -> None:
    calibration = TokenCalibration()
    gateway = make_gateway(scripted(), calibration=calibration)
    batch = make_batch(12)
    await gateway.analyze(batch)
    expected = min(2.0, max(0.5, 1234 / batch.estimated_input_tokens))
    assert calibration.factor("test-model") == pytest.approx(expected)


# --- rate limits and transient errors ------------------------------------------


async def test_429_then_success_retries_once_and_halves_the_limit() -> None:
    t = FakeClock()
    limiter = SpyLimiter(start=4, maximum=8, increase=0, pause_seconds=0.0)
    backend = scripted(["429", "ok"])
    metrics = Metrics()
    gateway = make_gateway(backend, time=t, limiter=limiter, metrics=metrics)
    batch = make_batch(12)
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 2 and outcome.reviews == []
    assert_exact_cover(batch, outcome)
    assert limiter.limit == 2
    assert limiter.priorities == [0, 1]  # the retry queued behind fresh work
    assert t.slept and t.slept[0] >= 2.0  # Retry-After honoured
    assert t.now >= 2.0
    # the Retry-After emptied and blocked both buckets, for every caller
    assert gateway.rpm.available < 1
    assert gateway.tpm.available < gateway.tpm.capacity / 2
    assert sample(metrics, "retro_model_rate_limited_total", lane="fast", limit="unknown") == 1
    assert sample(metrics, "retro_model_retries_total", lane="fast", reason="rate_limited") == 1
    assert sample(metrics, "retro_model_requests_total", lane="fast", status="rate_limited") == 1
    assert sample(metrics, "retro_model_concurrency_limit", lane="fast") == 2


async def test_429_without_retry_after_backs_off_with_jitter() -> None:
    t = FakeClock()
    gateway = make_gateway(scripted(["429-bare", "ok"]), time=t)
    outcome = await gateway.analyze(make_batch(6))
    assert outcome.calls == 2
    assert len(t.slept) == 1 and 0.5 <= t.slept[0] <= 1.0


async def test_5xx_three_times_goes_to_review_after_three_attempts() -> None:
    t = FakeClock()
    backend = scripted(default="500")
    metrics = Metrics()
    gateway = make_gateway(backend, time=t, metrics=metrics)
    batch = make_batch(12)
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 3 == len(backend.requests)
    assert outcome.fragments == []
    assert [r.reason for r in outcome.reviews] == ["model_unavailable"]
    assert_exact_cover(batch, outcome)
    assert len(t.slept) == 2
    assert 0.5 <= t.slept[0] <= 1.0 and 1.0 <= t.slept[1] <= 2.0
    assert sample(metrics, "retro_review_total", lane="fast", reason="model_unavailable") == 1
    assert sample(metrics, "retro_model_retries_total", lane="fast", reason="server_error") == 2


async def test_a_timeout_is_retried_and_counted_as_timeout() -> None:
    metrics = Metrics()
    gateway = make_gateway(scripted(["timeout", "ok"]), metrics=metrics)
    outcome = await gateway.analyze(make_batch(6))
    assert outcome.calls == 2 and not outcome.reviews
    assert sample(metrics, "retro_model_requests_total", lane="fast", status="timeout") == 1


async def test_a_backend_that_hangs_is_cut_off_by_the_gateway_timeout() -> None:
    async def hang_once(request: ChatRequest) -> ChatResult:
        if len(backend.requests) == 1:
            await asyncio.Event().wait()
        return respond("ok", request.messages)

    backend = HandlerBackend(hang_once)
    gateway = make_gateway(backend)
    gateway.caller.timeout_seconds = 0.05
    outcome = await gateway.analyze(make_batch(6))
    assert outcome.calls == 2 and not outcome.reviews and outcome.fragments


async def test_an_empty_retry_budget_sends_to_review_without_more_calls() -> None:
    backend = scripted(default="500")
    metrics = Metrics()
    budget = RetryBudget(ratio=0.0, minimum=1)
    gateway = make_gateway(backend, budget=budget, metrics=metrics)
    first = await gateway.analyze(make_batch(6))
    # the one retry of the budget was spent here; the third attempt was refused
    assert first.calls == 2
    assert [r.reason for r in first.reviews] == ["retry_budget_exhausted"]
    second = await gateway.analyze(make_batch(6, first_offset=100))
    assert second.calls == 1  # no retry at all now
    assert [r.reason for r in second.reviews] == ["retry_budget_exhausted"]
    assert len(backend.requests) == 3
    assert sample(metrics, "retro_model_retry_budget_exhausted_total", lane="fast") == 2


async def test_fresh_requests_earn_the_retries_they_may_spend() -> None:
    budget = RetryBudget(ratio=1.0, minimum=0, capacity=5)
    backend = scripted(["500", "ok"])
    outcome = await make_gateway(backend, budget=budget).analyze(make_batch(6))
    assert outcome.calls == 2 and not outcome.reviews  # the fresh request paid for its retry
    assert budget.balance == 0


async def test_a_permanent_rejection_goes_to_review_without_retry() -> None:
    backend = scripted(["rejected"])
    outcome = await make_gateway(backend).analyze(make_batch(6))
    assert outcome.calls == 1
    assert [r.reason for r in outcome.reviews] == ["model_rejected"]


# --- splitting ---------------------------------------------------------------------


async def test_finish_reason_length_splits_into_two_calls_covering_everything() -> None:
    backend = scripted(["length"])
    metrics = Metrics()
    gateway = make_gateway(backend, metrics=metrics)
    batch = make_batch(12)
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 3
    assert outcome.reviews == []
    assert_exact_cover(batch, outcome)
    halves = [extract_payload(c.messages) for c in backend.requests[1:]]
    assert sum(g["count"] for h in halves for g in h["groups"]) == 12
    assert all(sum(g["count"] for g in h["groups"]) == 6 for h in halves)
    assert sample(metrics, "retro_batch_splits_total", lane="fast", reason="truncated") == 1
    assert sample(metrics, "retro_model_requests_total", lane="fast", status="truncated") == 1


async def test_missing_refs_split_the_batch() -> None:
    backend = scripted(["missing"])
    metrics = Metrics()
    gateway = make_gateway(backend, metrics=metrics)
    batch = make_batch(12)
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 3 and outcome.reviews == []
    assert_exact_cover(batch, outcome)
    assert sample(metrics, "retro_batch_splits_total", lane="fast", reason="missing_records") == 1


async def test_context_too_long_splits_recursively_down_to_single_records() -> None:
    backend = scripted(default="context")
    gateway = make_gateway(backend)
    batch = make_batch(4)
    outcome = await gateway.analyze(batch)
    # 4 -> 2 + 2 -> 1 + 1 + 1 + 1: seven calls, four single-record reviews
    assert outcome.calls == 7
    assert [r.reason for r in outcome.reviews] == ["context_length"] * 4
    assert all(len(r.record_ids) == 1 for r in outcome.reviews)
    assert_exact_cover(batch, outcome)


async def test_a_single_record_cut_at_max_tokens_goes_to_review_as_truncated() -> None:
    backend = scripted(["length"])
    outcome = await make_gateway(backend).analyze(make_batch(1))
    assert outcome.calls == 1
    assert [r.reason for r in outcome.reviews] == ["truncated"]
    assert outcome.reviews[0].output is not None


async def test_a_prompt_over_the_context_is_split_before_any_call() -> None:
    backend = scripted()
    gateway = make_gateway(backend)
    gateway.context_window = 10  # nothing fits
    batch = make_batch(2)
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 0
    assert [r.reason for r in outcome.reviews] == ["context_length"] * 2
    assert_exact_cover(batch, outcome)


async def test_a_tpm_bucket_too_small_for_one_batch_is_a_config_error() -> None:
    gateway = make_gateway(scripted(), tpm_capacity=50)
    with pytest.raises(ConfigError, match="RETRO_MODEL__TPM"):
        await gateway.analyze(make_batch(6))


# --- malformed and invalid answers ---------------------------------------------------


async def test_malformed_output_gets_one_repair_then_succeeds() -> None:
    backend = scripted(["malformed", "ok"])
    metrics = Metrics()
    batch = make_batch(12)
    outcome = await make_gateway(backend, metrics=metrics).analyze(batch)
    assert outcome.calls == 2 and outcome.reviews == []
    assert_exact_cover(batch, outcome)
    repair = backend.requests[1].messages
    assert repair[:2] == backend.requests[0].messages
    assert repair[2]["role"] == "assistant" and "Here is what I found" in repair[2]["content"]
    assert repair[3]["role"] == "user"
    assert sample(metrics, "retro_model_retries_total", lane="fast", reason="malformed_output") == 1


async def test_malformed_twice_goes_to_review() -> None:
    backend = scripted(["malformed", "malformed", "ok"])
    batch = make_batch(12)
    outcome = await make_gateway(backend).analyze(batch)
    assert outcome.calls == 2
    assert [r.reason for r in outcome.reviews] == ["malformed_output"]
    assert "Here is what I found" in (outcome.reviews[0].output or "")
    assert_exact_cover(batch, outcome)


async def test_an_answer_breaking_the_contract_goes_to_review_with_its_reason() -> None:
    backend = scripted(["unknown_ref"])
    batch = make_batch(12)
    outcome = await make_gateway(backend).analyze(batch)
    assert outcome.calls == 1
    assert [r.reason for r in outcome.reviews] == ["unknown_ref"]
    assert_exact_cover(batch, outcome)


# --- cache ---------------------------------------------------------------------------


async def test_a_cache_hit_makes_no_call_and_covers_the_new_records() -> None:
    backend = scripted()
    metrics = Metrics()
    cache = MemoryCache(ttl_seconds=60, max_size=10)
    gateway = make_gateway(backend, cache=cache, metrics=metrics)
    first = make_batch(12)
    await gateway.analyze(first)
    assert len(backend.requests) == 1
    # the same content at other offsets: same key, new coverage
    again = make_batch(12, first_offset=500)
    outcome = await gateway.analyze(again)
    assert len(backend.requests) == 1
    assert outcome.calls == 0 and outcome.cache_hits == 1
    assert_exact_cover(again, outcome)
    assert Coverage.from_json(outcome.fragments[0].covered).intersection(first.coverage) == (
        Coverage()
    )
    assert sample(metrics, "retro_model_cache_total", lane="fast", result="hit") == 1
    assert sample(metrics, "retro_model_cache_total", lane="fast", result="miss") == 1


async def test_a_cached_answer_that_does_not_validate_is_a_miss() -> None:
    backend = scripted()
    cache = MemoryCache(ttl_seconds=60, max_size=10)
    gateway = make_gateway(backend, cache=cache)
    batch = make_batch(12)
    key = cache_key(batch, model="test-model", prompt_version="v1", detail="brief")
    await cache.set(key, json.dumps({"fragments": []}))  # covers nothing
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 1 and outcome.cache_hits == 0
    assert_exact_cover(batch, outcome)
    assert json.loads(await cache.get(key) or "{}")["fragments"]  # replaced by a good answer


async def test_failed_batches_are_not_cached() -> None:
    cache = MemoryCache(ttl_seconds=60, max_size=10)
    gateway = make_gateway(scripted(["unknown_ref"]), cache=cache)
    await gateway.analyze(make_batch(6))
    assert len(cache) == 0


# --- the property: exact cover under any fault ---------------------------------------

FAULTS = [
    "ok",
    "ok",
    "ok",
    "429",
    "429-bare",
    "500",
    "timeout",
    "context",
    "length",
    "missing",
    "malformed",
    "unknown_ref",
    "rejected",
]


async def test_every_record_ends_in_exactly_one_fragment_or_review() -> None:
    reasons: set[str] = set()
    fragments = splits = 0
    for seed in range(60):
        rng = random.Random(seed)
        backend = scripted(chooser=lambda rng=rng: rng.choice(FAULTS))
        budget = RetryBudget(ratio=0.2, minimum=rng.choice([0, 2, 10]))
        cache = MemoryCache(ttl_seconds=60, max_size=100) if seed % 2 else None
        metrics = Metrics()
        gateway = make_gateway(backend, budget=budget, cache=cache, seed=seed, metrics=metrics)
        batches = [
            make_batch(
                rng.randint(1, 40),
                templates=rng.randint(1, 6),
                first_offset=k * 1000,
                partition=rng.randint(0, 2),
            )
            for k in range(3)
        ]
        outcomes = await asyncio.gather(*(gateway.analyze(b) for b in batches))
        for batch, outcome in zip(batches, outcomes, strict=True):
            assert_exact_cover(batch, outcome)
            # bounded work: each of at most 2n-1 sub-batches makes at most 2 * 3 calls
            assert outcome.calls <= 6 * (2 * batch.record_count - 1)
            reasons.update(r.reason for r in outcome.reviews)
            fragments += len(outcome.fragments)
        assert sum(o.calls for o in outcomes) == len(backend.requests)
        assert gateway.limiter.in_flight == 0
        splits += sum(
            sample(metrics, "retro_batch_splits_total", lane="fast", reason=why)
            for why in ("truncated", "missing_records", "context_length")
        )
    # the script really exercised the paths whose coverage is checked above
    assert fragments > 50 and splits > 20
    assert {"model_rejected", "unknown_ref", "malformed_output"} <= reasons
    assert reasons & {"model_unavailable", "retry_budget_exhausted"}
    assert reasons & {"context_length", "truncated"}


async def test_the_embedded_rules_backend_runs_the_whole_path_offline() -> None:
    from streams.gateway.backends import RulesBackend
    from streams.tokens import TokenCounter

    counter = TokenCounter()
    batch = build_batch(
        make_records(30, templates=4),
        lane="fast",
        counter=counter,
        max_example_tokens=None,
        trigger="budget",
    )
    calibration = TokenCalibration()
    gateway = make_gateway(
        RulesBackend(counter=counter),
        cache=MemoryCache(ttl_seconds=60, max_size=10),
        calibration=calibration,
    )
    outcome = await gateway.analyze(batch)
    assert outcome.calls == 1 and outcome.reviews == [], outcome.reviews
    assert_exact_cover(batch, outcome)
    # the batcher's estimate is an upper bound of what the counter sees in the prompt
    assert calibration.factor("test-model") <= 1.0


# --- roll-up summaries (Gateway.summarize) ----------------------------------------------


def rollup_prompt(count: int = 28) -> list[dict[str, Any]]:
    from streams.gateway.rollup_prompt import rollup_messages

    payload = {
        "kind": "rollup",
        "report": "2026-01-02/all",
        "incident": {"key": "k1", "event": "Disk full", "cause": "no space", "severity": "high",
                     "services": ["hdfs"], "count": count, "first_seen": None, "last_seen": None,
                     "templates": [], "suggestions": []},
    }  # fmt: skip
    return rollup_messages(payload, prompt_version="v1")


def summaries(script: Sequence[str] = (), *, default: str = "ok") -> HandlerBackend:
    """A provider playing a script of roll-up outcomes; the summary names the event and
    count it read."""
    actions = list(script)

    async def play(request: ChatRequest) -> ChatResult:
        action = actions.pop(0) if actions else default
        await asyncio.sleep(0)
        incident = extract_payload(request.messages)["incident"]
        summary = json.dumps({"summary": f"{incident['event']}: {incident['count']} records."})
        if action == "ok":
            return ChatResult(summary, "stop", 300, 20)
        if action == "fenced":
            return ChatResult(f"Here it is:\n```json\n{summary}\n```", "stop", 300, 25)
        if action == "malformed":
            return ChatResult("The disk is full, I think.", "stop", 300, 8)
        if action == "length":
            return ChatResult(summary[:12], "length", 300, 400)
        if action == "429":
            raise RateLimited("429 from provider", retry_after=2.0)
        if action == "500":
            raise TransientModelError("500 from provider", reason="server_error")
        if action == "rejected":
            raise PermanentModelError("400 bad request", reason="model_rejected")
        raise AssertionError(f"unknown action {action}")

    return HandlerBackend(play)


async def test_summarize_is_one_call_within_the_limits() -> None:
    backend = summaries()
    metrics = Metrics()
    limiter = SpyLimiter(start=4, maximum=8, pause_seconds=0.0)
    gateway = make_gateway(backend, limiter=limiter, metrics=metrics)
    tpm_before = gateway.tpm.available
    summary, reason = await gateway.summarize(rollup_prompt(), max_tokens=300)
    assert (summary, reason) == ("Disk full: 28 records.", None)
    assert len(backend.requests) == 1 and backend.requests[0].max_tokens == 300
    assert limiter.priorities == [0]
    assert gateway.rpm.available < 600
    assert tpm_before - gateway.tpm.available >= 300  # prompt estimate + reserved answer
    assert sample(metrics, "retro_model_requests_total", lane="fast", status="ok") == 1
    assert sample(metrics, "retro_model_tokens_total", lane="fast", kind="completion") == 20
    assert sample(metrics, "retro_fragments_total", lane="fast") == 0


async def test_summarize_retries_a_429_after_its_retry_after() -> None:
    t = FakeClock()
    limiter = SpyLimiter(start=4, maximum=8, increase=0, pause_seconds=0.0)
    backend = summaries(["429", "fenced"])
    metrics = Metrics()
    gateway = make_gateway(backend, time=t, limiter=limiter, metrics=metrics)
    summary, reason = await gateway.summarize(rollup_prompt())
    assert (summary, reason) == ("Disk full: 28 records.", None)
    assert len(backend.requests) == 2
    assert limiter.priorities == [0, 1] and limiter.limit == 2
    assert t.slept and t.slept[0] >= 2.0  # Retry-After honoured
    assert sample(metrics, "retro_model_retries_total", lane="fast", reason="rate_limited") == 1


async def test_summarize_never_raises_for_model_errors() -> None:
    t = FakeClock()
    backend = summaries(default="500")
    gateway = make_gateway(backend, time=t)
    assert await gateway.summarize(rollup_prompt()) == (None, "model_unavailable")
    assert len(backend.requests) == 3
    rejected = make_gateway(summaries(["rejected"]))
    assert await rejected.summarize(rollup_prompt()) == (None, "model_rejected")
    cut = make_gateway(summaries(["length"]))
    assert await cut.summarize(rollup_prompt()) == (None, "truncated")
    empty = make_gateway(summaries(default="500"), budget=RetryBudget(minimum=0, ratio=0))
    assert await empty.summarize(rollup_prompt()) == (None, "retry_budget_exhausted")


async def test_summarize_repairs_a_malformed_answer_once() -> None:
    backend = summaries(["malformed", "ok"])
    metrics = Metrics()
    gateway = make_gateway(backend, metrics=metrics)
    assert await gateway.summarize(rollup_prompt()) == ("Disk full: 28 records.", None)
    repair = backend.requests[1].messages
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"] == "The disk is full, I think."
    assert '"summary"' in repair[3]["content"]
    assert sample(metrics, "retro_model_retries_total", lane="fast", reason="malformed_output") == 1

    twice = summaries(default="malformed")
    gateway = make_gateway(twice)
    assert await gateway.summarize(rollup_prompt()) == (None, "malformed_output")
    assert len(twice.requests) == 2


async def test_summarize_cache_hit_makes_no_call() -> None:
    backend = summaries()
    metrics = Metrics()
    cache = MemoryCache(ttl_seconds=60, max_size=10)
    gateway = make_gateway(backend, cache=cache, metrics=metrics)
    first = await gateway.summarize(rollup_prompt())
    assert await gateway.summarize(rollup_prompt()) == first == ("Disk full: 28 records.", None)
    assert len(backend.requests) == 1
    assert sample(metrics, "retro_model_cache_total", lane="fast", result="hit") == 1
    # the incident grew: another prompt, another key, a new call
    assert await gateway.summarize(rollup_prompt(count=30)) == ("Disk full: 30 records.", None)
    assert len(backend.requests) == 2
    # a failed summary is not cached
    failing = make_gateway(summaries(["malformed", "malformed", "ok"]), cache=cache)
    assert await failing.summarize(rollup_prompt(count=31)) == (None, "malformed_output")
    assert await failing.summarize(rollup_prompt(count=31)) == ("Disk full: 31 records.", None)
