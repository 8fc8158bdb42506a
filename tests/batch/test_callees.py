"""The names a failure gives for the service it called, and the prefilter of the
failed-call pattern, which never skips a text the pattern matches."""

from __future__ import annotations

import random

from streams.batch.callees import _FAILED_CALL, _FAILED_CALL_HINT, named_services

WORDS = ["payment-gateway", "http://inventory:8080/api", "returned", "responded", "with",
         "answered", "gave", "status", "HTTP", "503", "502 ", "500", "from", "by", "BY",
         "RETURNED", "\t", "\n", " ", "  ", "x", "db.svc", "5009", "550", ":", "/", "ok"]


def test_every_text_the_pattern_matches_holds_the_hint() -> None:
    rng = random.Random(42)
    matched = 0
    for _ in range(20_000):
        text = "".join(rng.choice(WORDS) + rng.choice(["", " ", "  ", "\t"])
                       for _ in range(rng.randint(1, 8)))
        if _FAILED_CALL.search(text) is not None:
            matched += 1
            assert _FAILED_CALL_HINT.search(text) is not None, text
    assert matched > 500


def test_the_failed_calls_are_still_named() -> None:
    assert named_services(["checkout: payment-gateway returned 503 on /pay"]) == [
        "payment-gateway"]
    assert named_services(["got 502 from inventory-db"]) == ["inventory-db"]
    assert named_services(["auth responded with HTTP 500"]) == ["auth"]
    assert named_services(["java.lang.Thread.run(Thread.java:833) at 512"]) == []


def test_the_path_of_a_failed_request_gives_its_first_segments() -> None:
    """A caller that quotes its callee's error body (Spring Boot's, NestJS's) gives the
    path it asked for; its first segments may spell the callee (``/api/v1/seatservice``);
    the resource after them does not, and neither does a file's path."""
    spring = ('HttpServerErrorException$InternalServerError: 500 Internal Server Error: '
              '[{"timestamp":"2023-01-30T12:01:02.090+00:00","status":500,'
              '"path":"/api/v1/seatservice/seats/left_tickets"}]')
    assert named_services([spring], urls=True) == ["seatservice"]
    assert named_services([spring]) == []  # a path is read with the URLs only
    assert named_services(["GET http://gateway:8080/orders-api/v2/carts/77 failed"],
                          urls=True) == ["gateway", "orders-api", "carts"]
    assert named_services(['File "/app/wallet/views.py", line 88, in post'],
                          urls=True) == []


def test_the_messages_of_common_clients_name_the_service_they_called() -> None:
    ribbon = ("com.netflix.client.ClientException: Load balancer does not have available "
              "server for client: ts-route-service")
    assert named_services([ribbon]) == ["ts-route-service"]
    assert named_services(["java.net.UnknownHostException: ts-price-service"]) == [
        "ts-price-service"]
    feign = ("feign.FeignException$InternalServerError: status 500 reading "
             "OrderServiceClient#getOrder(String); content: {}")
    assert named_services([feign]) == ["OrderService"]
    # a 404 is the caller's own request gone wrong, not the callee failing
    assert named_services([feign.replace("500", "404")]) == []
