"""Load the JSON Schemas in ``schemas/`` (the message contract) and build validators.

The schemas live at the repository root, next to the ``streams`` package, so
other languages and tools can read them without Python. Loaded on first use and
cached; nothing is read at import time.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.protocols import Validator

from streams.errors import ConfigError

logger = logging.getLogger(__name__)

SCHEMA_SUFFIX = ".schema.json"


def schemas_dir() -> Path:
    """``<repo>/schemas``; raise ConfigError when the package was installed without it."""
    path = Path(__file__).resolve().parents[1] / "schemas"
    if not path.is_dir():
        raise ConfigError(
            f"schema folder {path} is missing: run retro-stream from its source tree "
            "(pip install -e .) so schemas/ sits next to the streams package"
        )
    return path


def _file_name(name: str) -> str:
    """ "record", "record.schema.json" -> "record.schema.json"."""
    return name if name.endswith(SCHEMA_SUFFIX) else name + SCHEMA_SUFFIX


@lru_cache(maxsize=32)
def _load(file_name: str) -> dict[str, Any]:
    path = schemas_dir() / file_name
    try:
        with path.open(encoding="utf-8") as fh:
            schema = json.load(fh)
    except FileNotFoundError as exc:
        known = sorted(p.name for p in schemas_dir().glob("*" + SCHEMA_SUFFIX))
        raise ConfigError(f"no schema {file_name!r} in {path.parent}; known: {known}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"schema {path} is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise ConfigError(f"schema {path} must be a JSON object")
    return schema


def load_schema(name: str) -> dict[str, Any]:
    """The schema called ``name`` ("record" or "record.schema.json"), as a fresh dict.

    A deep copy, so a caller that edits it cannot change what validators use.
    """
    return json.loads(json.dumps(_load(_file_name(name))))


@lru_cache(maxsize=32)
def validator(name: str) -> Validator:
    """A checked validator for the schema ``name``, built once per process."""
    schema = _load(_file_name(name))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"schema {name!r} is not a valid JSON Schema: {exc.message}") from exc
    return cls(schema, format_checker=cls.FORMAT_CHECKER)
