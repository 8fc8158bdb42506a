"""Which other service a log line says it called: the names callers' errors give.

When a service fails, its callers say so in their own words: "no instances available
for X", "connection refused to X", "X returned 503", "UnknownHostException: X", a
Feign client's "status 500 reading XClient#...", a URL ``http://X:8080/...``, or the
path of the request that failed (``"path":"/api/v1/xservice/..."``, as an error body
the caller quotes gives it). The batch stage counts those names per template
(``Evidence.named``) so the report can point a caller's failure at its callee; the
analysis only believes a name that matches a service seen in the records' service
field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# generic parts of service names: they appear in every name, so they match anything
GENERIC_NAME_WORDS = frozenset({
    "service", "services", "svc", "impl", "controller", "server", "api", "app", "application",
    "backend", "frontend", "client", "worker", "handler", "manager", "deployment", "pod",
    "default", "prod", "production", "staging", "main", "the", "internal", "http", "https",
    "com", "org", "net", "io", "log", "json", "docker", "stdout", "stderr",
})
_NAME_WORD = re.compile(r"[A-Za-z]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NAMED = re.compile(
    r"(?:no (?:available )?(?:instances?|endpoints?|servers?|hosts?|replicas?|upstreams?)"
    r"(?: available)?(?: for| of| in)?(?: service)?"
    r"|(?:connection|connect) (?:refused|reset|timed out|failed|error)"
    r"(?: (?:to|for|from|when connecting to|while connecting to))?"
    r"|(?:could not|cannot|can't|unable to|failed to) (?:connect|reach|resolve|call)(?: to)?"
    r"|(?:timed out|timeout)(?: after \d+ ?[a-z]*)? (?:calling|connecting to|waiting for|from)"
    r"|(?:call|request|rpc) (?:to|for) \S+ failed|(?:error|exception) (?:calling|from)"
    r"|upstream|downstream"
    r"|does not have available server for client"  # Ribbon's load balancer
    r"|unknownhostexception)"  # Java's DNS lookup of the callee's host
    r"\s*[:=]?\s*['\"\[(<]?(?:https?://)?(?P<name>[A-Za-z][\w.-]{2,62})",
    re.IGNORECASE,
)
_CALL_FAILED = re.compile(  # "request to X timed out", "calls to X failed"
    r"\b(?:requests?|calls?|rpcs?|connections?) (?:to|for) (?:https?://)?"
    r"(?P<name>[A-Za-z][\w.-]{2,62})\S* (?:timed out|failed|was refused|refused|reset)",
    re.IGNORECASE,
)
_FAILED_CALL = re.compile(  # "X returned 503", "503 from X", "X: 502 Bad Gateway"
    r"(?:(?:https?://)?(?P<a>[A-Za-z][\w-]{2,62})(?:[.:/][\w./:-]*)?\s+(?:returned|responded"
    r"(?: with)?|answered|gave)\s+(?:http\s*|status\s*)?5\d\d\b)"
    r"|(?:\b5\d\d\b\s+(?:from|by)\s+(?:https?://)?(?P<b>[A-Za-z][\w-]{2,62}))",
    re.IGNORECASE,
)
# a part every match of _FAILED_CALL holds (the verb between two spaces, or the status,
# spaces and "from"/"by"): where it is missing the scan is skipped, as that scan tries
# each word of a long message (a stack trace) at every length it could have
_FAILED_CALL_HINT = re.compile(
    r"\s(?:returned|responded|answered|gave)\s|5\d\d\s+(?:from|by)\s", re.IGNORECASE)
# Feign's "status 500 reading OrderServiceClient#getOrder(String)": the client interface
# is named for the service it calls
_FEIGN_STATUS = re.compile(
    r"\bstatus 5\d\d reading (?P<name>[A-Za-z]\w{2,62}?)(?:FeignClient|Client)?#")
_URL_HOST = re.compile(r"\bhttps?://(?P<name>[A-Za-z][\w-]{2,62})(?:[.:/]|\b)")
# the path of a request: a URL's, or the "path" field of an error body (Spring Boot's,
# NestJS's); its first segments may name the service that answered it
_REQUEST_PATH = re.compile(
    r"(?:\bhttps?://[\w.-]+(?::\d+)?|[\"']path[\"']\s*:\s*[\"'])(?P<path>/[\w./-]+)")
PATH_SEGMENTS = 3  # /api/v1/<service>/...: further segments are resources, not services


def name_words(name: str) -> frozenset[str]:
    """The words of a service name that tell it apart: ``f.m.s.BasicServiceImpl`` ->
    {basic}; ``ts-basic-service-5dc8d4`` -> {basic}."""
    spaced = _CAMEL.sub(" ", name)
    words = {w.lower() for w in _NAME_WORD.findall(spaced)}
    return frozenset(w for w in words if len(w) > 2 and w not in GENERIC_NAME_WORDS)


def same_service(a: str, b: str) -> bool:
    """Two names of one service: their telling words overlap."""
    return bool(name_words(a) & name_words(b))


def named_services(texts: Iterable[str], *, urls: bool = False) -> list[str]:
    """Services a failure names as the one it called, in order of appearance; with
    ``urls``, the hosts of the URLs it names and the first segments of the request
    paths too (a caller's error that quotes the request it sent)."""
    out: list[str] = []
    for text in texts:
        for m in _NAMED.finditer(text):
            out.append(m["name"].rstrip(".-"))
        for m in _CALL_FAILED.finditer(text):
            out.append(m["name"].rstrip(".-"))
        for m in _FAILED_CALL.finditer(text) if _FAILED_CALL_HINT.search(text) else ():
            out.append((m["a"] or m["b"]).rstrip(".-"))
        for m in _FEIGN_STATUS.finditer(text):
            out.append(m["name"])
        for m in _URL_HOST.finditer(text) if urls else ():
            out.append(m["name"].rstrip(".-"))
        for m in _REQUEST_PATH.finditer(text) if urls else ():
            out.extend(s for s in m["path"].split("/")[1:PATH_SEGMENTS + 1] if s)
    return [n for n in dict.fromkeys(out) if name_words(n)]


