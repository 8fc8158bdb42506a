"""Prompts for the model: instructions plus one JSON payload describing a batch.

The payload format is the contract between the batcher, every backend (the
offline ``rules`` analyzer, the simulated provider, a real model) and validation::

    {"lane": "fast", "detail": "brief",
     "groups": [{"ref": "g1", "service": "hdfs", "level": "ERROR",
                 "template": "Connection to <*> refused", "count": 12,
                 "first_seen": "...", "last_seen": "...",
                 "examples": ["Connection to 10.0.0.1 refused"], "truncated": false}]}

The answer must be JSON::

    {"fragments": [{"refs": ["g1"], "service": "hdfs", "event": "...", "cause": "...",
                    "suggestion": "...", "severity": "high"}]}

where every ref of the payload appears in exactly one fragment.
"""

from __future__ import annotations

import json
from typing import Any

from streams.errors import MalformedOutput

PAYLOAD_MARKER = "\nINPUT_JSON:\n"


def embed_payload(instructions: str, payload: dict[str, Any]) -> str:
    """The user message: instructions, then the marker, then the payload as JSON."""
    return instructions + PAYLOAD_MARKER + json.dumps(payload, ensure_ascii=False)


def extract_payload(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Find the payload in the last user message (used by backends that read prompts)."""
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str):
            if PAYLOAD_MARKER in content:
                try:
                    payload = json.loads(content.rsplit(PAYLOAD_MARKER, 1)[1])
                except json.JSONDecodeError as exc:
                    raise MalformedOutput(f"prompt payload is not JSON: {exc}") from exc
                if isinstance(payload, dict):
                    return payload
    raise MalformedOutput("no INPUT_JSON payload in the user messages")
