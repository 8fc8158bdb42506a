"""Root cause over symptoms (streams.report.analysis.origin): callers name the service they call."""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.batch.callees import name_words, named_services, same_service
from streams.report.analysis.origin import find_origin


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


# --- trace links ------------------------------------------------------------------------


def _ids(*numbers: int) -> set[str]:
    return {f"{n:032x}" for n in numbers}


def _cascade() -> tuple[list[C], dict[int, list[str]], dict[int, set[str]]]:
    """Two callers whose texts name no one, and the dependency both call: each caller
    shares its failed requests with it, not with the other caller. The dependency is
    neither the loudest nor the first to log."""
    causes = [
        C("Checkout requests failed", ["checkout"], 40, "2026-01-29T10:00:05Z", "high"),
        C("Cart update failed", ["cart"], 25, "2026-01-29T10:00:02Z", "high"),
        C("Stock query failed", ["inventory"], 9, "2026-01-29T10:00:03Z"),
    ]
    texts = {0: ["Checkout requests failed", "POST /checkout 500"],
             1: ["Cart update failed", "cart <*> not saved"],
             2: ["Stock query failed", "query on stock_items failed: deadlock"]}
    traces = {0: _ids(1, 2, 3, 11), 1: _ids(4, 5, 12), 2: _ids(1, 2, 4, 5, 6)}
    return causes, texts, traces


def test_trace_ids_shared_with_each_caller_make_the_called_service_the_origin() -> None:
    causes, texts, traces = _cascade()
    assert all(named_services(t) == [] for t in texts.values())  # no name to go by
    failing = {0: True, 1: True, 2: True}
    assert find_origin(causes, texts, failing).service == "cart"  # the earliest error
    origin = find_origin(causes, texts, failing, traces=traces)
    assert origin is not None and origin.logged
    # inventory shares 1, 2 with checkout and 4, 5 with cart; each caller only its own
    assert (origin.service, origin.first_seen) == ("inventory", "2026-01-29T10:00:03Z")
    assert origin.callers == ("cart", "checkout")
    assert "4 failed request(s)" in origin.reason and "2 calling service(s)" in origin.reason


def test_a_trace_shared_within_one_service_or_with_a_warning_links_nothing() -> None:
    causes, texts, traces = _cascade()
    causes[0].services = ["inventory-7f9c"]  # a pod of the same service: no caller
    origin = find_origin(causes, texts, {0: True, 1: False, 2: True}, traces=traces)
    assert origin is not None
    assert (origin.service, origin.reason, origin.callers) == (
        "inventory", "the earliest error", ())


def test_one_link_has_no_direction_so_the_earlier_failure_is_the_origin() -> None:
    causes = [C("Payment failed", ["payments"], 3, "2026-01-29T10:00:04Z"),
              C("Order failed", ["orders"], 30, "2026-01-29T10:00:05Z")]
    origin = find_origin(causes, {0: [], 1: []}, {0: True, 1: True},
                         traces={0: _ids(7, 8), 1: _ids(8, 9)})
    assert origin is not None and (origin.service, origin.callers) == ("payments", ("orders",))


def test_a_named_service_that_failed_wins_over_trace_links() -> None:
    causes, texts, traces = _cascade()
    causes.append(C("Price lookups failed", ["pricing-api"], 4, "2026-01-29T10:00:09Z"))
    texts[0].append("connection refused to pricing-api:8080")
    traces[3] = _ids(99)
    origin = find_origin(causes, texts, {i: True for i in range(4)}, traces=traces)
    assert origin is not None
    assert (origin.service, origin.callers) == ("pricing-api", ("checkout",))
    assert origin.reason == "named by failures in 1 calling service(s)"


def test_services_trace_linked_to_a_named_origin_are_among_its_callers() -> None:
    causes, texts, traces = _cascade()
    texts[0].append("timed out calling inventory-svc after 3000 ms")
    origin = find_origin(causes, texts, {0: True, 1: True, 2: True}, traces=traces)
    assert origin is not None and origin.service == "inventory"
    assert origin.callers == ("cart", "checkout")  # checkout named it, cart shares traces
    assert origin.reason.startswith("named by failures in 1 calling service(s); failed "
                                    "requests shared with 2 service(s)")
    without = find_origin(causes, texts, {0: True, 1: True, 2: True})
    assert without is not None and without.callers == ("checkout",)
