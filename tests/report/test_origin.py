"""Root cause over symptoms (streams.report.origin): callers name the service they call."""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.report.origin import find_origin, name_words, named_services, same_service


@dataclass
class C:
    title: str
    services: list[str]
    count: int
    first_seen: str | None
    severity: str = "medium"
    subjects: list[str] = field(default_factory=list)


def test_name_words_keep_what_tells_services_apart() -> None:
    assert name_words("f.m.s.BasicServiceImpl") == {"basic"}
    assert name_words("ts-basic-service-5dc8d4f9fd-46997") == {"basic"}
    assert name_words("payment-api") == {"payment"}
    assert same_service("ts-basic-service", "f.m.s.BasicServiceImpl")
    assert not same_service("ts-basic-service", "o.s.OrderServiceImpl")
    assert not same_service("order-service", "user-service")  # "service" says nothing


def test_phrasings_that_name_the_called_service() -> None:
    texts = [
        "Load balancer does not have available server for client: ts-seat-service",
        "No instances available for ts-basic-service",
        "Connection refused to inventory-db:5432",
        "upstream payments returned 503 Service Unavailable",
        "HTTP 502 from pricing-api while quoting",
        "failed to connect to redis-cache after 3 attempts",
        "request to shipping-svc timed out after 3000ms, giving up",
        "timeout after 5000 ms waiting for ledger",
    ]
    found = named_services(texts)
    for name in ("ts-basic-service", "inventory-db", "payments", "pricing-api", "redis-cache",
                 "shipping", "ledger"):
        assert any(same_service(name, f) for f in found), (name, found)


def test_similar_lines_that_name_no_callee() -> None:
    assert named_services(["Connection closed by user", "Order not found for id 42",
                           "connected to primary in 3 ms"]) == []


def test_the_callee_named_by_callers_is_the_origin_not_the_loud_callers() -> None:
    causes = [
        C("Service discovery: no instances of a downstream service", ["gateway"], 40,
          "2026-01-29T09:26:19Z", "high", ["ts-basic-service"]),
        C("Timeouts calling a dependency", ["order-service"], 25, "2026-01-29T09:26:12Z",
          "high"),
        C("Unusual ERROR: [queryForTravel][catch price exception]", ["f.m.s.BasicServiceImpl"],
          8, "2026-01-29T09:26:03Z"),
    ]
    texts = {0: ["No instances available for ts-basic-service"],
             1: ["timed out calling basic-service after 5000 ms"], 2: []}
    origin = find_origin(causes, texts, {0: True, 1: True, 2: True})
    assert origin is not None
    assert origin.service == "f.m.s.BasicServiceImpl"
    assert origin.first_seen == "2026-01-29T09:26:03Z"
    assert set(origin.callers) == {"gateway", "order-service"}
    assert origin.logged


def test_a_callee_that_logged_nothing_is_still_named_with_the_first_complaint() -> None:
    causes = [C("Connection failures", ["checkout"], 30, "2026-01-29T10:00:05Z", "high"),
              C("Connection failures", ["cart"], 12, "2026-01-29T10:00:02Z", "high")]
    texts = {0: ["connection refused to inventory-svc:8080"],
             1: ["could not connect to inventory-svc"]}
    origin = find_origin(causes, texts, {0: True, 1: True})
    assert origin is not None and not origin.logged
    assert same_service(origin.service, "inventory")
    assert origin.first_seen == "2026-01-29T10:00:02Z"


def test_without_names_the_earliest_error_is_the_origin() -> None:
    causes = [C("Disk full", ["db"], 5, "2026-01-29T10:00:09Z"),
              C("Slow queries", ["api"], 50, "2026-01-29T10:00:01Z")]
    origin = find_origin(causes, {0: [], 1: []}, {0: True, 1: True})
    assert origin is not None and (origin.service, origin.reason) == ("api", "the earliest error")


def test_warnings_alone_give_no_origin() -> None:
    causes = [C("Unusual WARN: order not found", ["order"], 5, "2026-01-29T10:00:00Z")]
    assert find_origin(causes, {0: []}, {0: False}) is None
