"""Log template mining (Drain, on drain3's tree) with template ids that survive restarts.

Why templates: a batch sends one entry per (service, template) with a count, so
thousands of "Receiving block <BLK> src: <IP> dest: <IP>" lines cost one line of
prompt. Why our own ids: drain3's cluster ids are per-process counters. The id here
is a hash of the template text a cluster was born with, and it stays while the
template generalises, so inside one worker one event keeps one id. Across workers
and restarts the miner's state is not shared: the report stage resolves one
template per event instead, by coverage of the texts (``streams.report.state.evidence``).
That was chosen over a miner state shared through Kafka because it needs no
coordination on the clean stage's hot path, survives any rebalance or replay, and
merges cleanly in any order; the cost is that two workers' ids for one event differ
until the report folds them. The masks below replace the usual variables (dates,
block ids, IPs, paths, hex, numbers) before Drain sees the line.

Drain merges two lines whose tokens mostly agree. Plain Drain merges "VM Started"
with "VM Paused" and "GET" with "POST": in short messages one differing word is a
different event far more often than a variable. So a line does not join a cluster
whose template holds another word (letters, no digits) where the line has one,
unless the word already stands in two templates (a user or host name, which turns up
in many events) or that template position has already refused ``WORD_ESCAPE``
distinct words (a free-text variable).

Nothing is persisted and no ``drain3.ini`` is read from the working directory:
the configuration is built in code.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from drain3.drain import Drain, LogCluster, LogClusterCache

logger = logging.getLogger(__name__)

DEFAULT_SIM_TH = 0.4
DEFAULT_DEPTH = 4
DEFAULT_MAX_CLUSTERS = 5000
DEFAULT_MAX_CHILDREN = 100
ID_PREFIX = "t"
ID_HEX_CHARS = 10
PARAM = "<*>"
# distinct words a template position refuses before it is taken for a variable
WORD_ESCAPE = 8
# a word born into this many templates names a thing (user, host), not an event
ENTITY_TEMPLATES = 2
# words whose template counts are remembered; past it the counts start again
MAX_WORDS = 100_000

_B = r"(?<![A-Za-z0-9_])"  # not inside a word
_E = r"(?![A-Za-z0-9_])"

# a prefilter: the text holds a digit; looked for once per line, since masks add none
_DIGIT = "digit"

_MON = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
        r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_WDAY = r"(?:Mon|Tue(?:s)?|Wed(?:nes)?|Thu(?:rs)?|Fri|Sat(?:ur)?|Sun)(?:day)?"
_TIME = r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
_IP = r"\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?"

# (pattern, mask name, prefilters) in the order applied; earlier masks protect their
# text from later ones. A mask runs only when the text, as the masks before left it,
# holds a digit (if ``_DIGIT`` is among its prefilters) and something one of its other
# prefilters finds (if it has any). Each prefilter finds a part that every match of
# the pattern holds, so a skip changes nothing. Most lines need few of the
# substitutions, and a prefilter that opens with a literal character is a quick scan
# for that character, where a pattern that opens with a lookbehind is tried at every
# position. So where it can, a pattern opens with its first character and checks the
# boundary behind it (``\d(?<![\w.]\d)`` for ``(?<![\w.])\d``: tests/clean/test_mask.py
# holds the plain spellings), and takes digits possessively (``\d++``) where giving
# one back could never make a match.
MASKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # a date written inside the message ("at Sun Jul  3 13:52:21 2005") as one token:
    # its day and month names would otherwise read as words that tell events apart
    (
        r"(?<![\w.])(?:"
        + _WDAY + r",?\s+" + _MON + r"\s+\d{1,2}(?:\s+" + _TIME + r")?(?:\s+[A-Z]{3,4})?"
        + r"(?:\s+\d{4})?"
        + r"|" + _MON + r"\s+\d{1,2}(?:,?\s+\d{4})?\s+" + _TIME + r"(?:\s+\d{4})?"
        + r"|\d{4}-\d{2}-\d{2}(?:[T ]" + _TIME + r")?(?:Z|[+-]\d{2}:?\d{2})?"
        + r")(?!\w)(?!\.\d)",
        "DATE",
        # two searches, since one alternation of both would lose the fast first-character
        # scan; every full month name is its abbreviation and lowercase letters
        (_DIGIT, r"-\d\d-", r"(?:Jan|Feb|Ma[ry]|Apr|Ju[nl]|Aug|Sep|Oct|Nov|Dec)[a-z]*\s+\d"),
    ),
    # HDFS block ids, and a run of them ("delete blk_1 blk_2 ...") as one token so
    # the number of blocks does not change the template.
    (r"b(?<![\w/]b)lk_-?\d+(?:[ ,]+blk_-?\d+)*", "BLK", ("blk_",)),
    (
        _B + r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" + _E,
        "UUID", (r"-[0-9a-fA-F]{4}-",),
    ),
    # a comma-separated list of addresses (a proxy chain) as one token, like one address
    (r"\d(?<![\w.]\d)\d{0,2}+(?:\.\d{1,3}+){3}(?::\d{1,5}+)?(?:,[ ]?" + _IP + r")*(?![\w.])", "IP",
     (_DIGIT, r"\.\d+\.\d+\.")),
    # three inner groups, so a time's two colons do not pass
    (_B + r"(?:[0-9A-Fa-f]{2}:){5,}[0-9A-Fa-f]{2}" + _E, "MAC",
     (r":[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}:",)),
    (r"/(?<![\w/<>*]/)[\w.\-]+(?:/[\w.\-]+)+/?", "PATH", (r"/[\w.\-]+/",)),
    (r"0(?<![A-Za-z0-9_]0)[xX][0-9a-fA-F]+" + _E, "HEX", (_DIGIT, r"0[xX][0-9a-fA-F]")),
    # bare hex of 8+ with a letter and a digit: object hashes, trace and session ids
    (_B + r"(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}" + _E, "HEX",
     (_DIGIT, r"[0-9a-fA-F]{8}")),
    # a sign or digit, then digits; the last character taken a digit (a lone sign is none)
    (r"[-+\d](?<![\w.].)\d*+(?<=\d)(?:\.\d++)?(?:ms|us|ns|s|[KMGT]i?B|B)?(?![\w.])", "NUM",
     (_DIGIT,)),
)
_HAS_DIGIT = re.compile(r"\d")
# a token that holds a digit or a mask is a variable: never a branch of Drain's tree
_VARIABLE = re.compile(r"[\d<]")
_LETTER = re.compile(r"[^\W\d_]")

# messages of at most this many characters are remembered with their masked text:
# about half the messages of the loghub samples repeat one seen before (a constant
# message, the same request), and a hit costs a lookup instead of the substitutions;
# the bounds keep the memo to a few MB
MEMO_MAX_CHARS = 256
MEMO_SIZE = 4096
# masked lines remembered with the cluster they joined (a few MB at most)
JOINED_MAX_CHARS = 512
JOINED_LINES = 8192

_Search = Callable[[str], "re.Match[str] | None"]
_COMPILED: tuple[tuple[Callable[[str, str], str], str, bool, tuple[_Search, ...]], ...] = tuple(
    (re.compile(pattern).sub, f"<{name}>", _DIGIT in prefilters,
     tuple(re.compile(f).search for f in prefilters if f != _DIGIT))
    for pattern, name, prefilters in MASKS
)


def _mask(text: str) -> str:
    """``mask`` without the memo: the masks whose prefilters find something."""
    has_digit = _HAS_DIGIT.search(text) is not None
    for sub, replacement, needs_digit, prefilters in _COMPILED:
        if needs_digit and not has_digit:
            continue
        if prefilters:
            for found in prefilters:
                if found(text) is not None:
                    break
            else:
                continue
        text = sub(replacement, text)
    return text


_mask_memo = functools.lru_cache(maxsize=MEMO_SIZE)(_mask)


def mask(text: str) -> str:
    """``text`` with every mask applied, in order (``<NAME>`` in place of the variable).

    A mask runs only when its prefilters find a part every match holds: most lines
    need few of the substitutions. Short messages are memoised: about half repeat.
    """
    if len(text) <= MEMO_MAX_CHARS:
        return _mask_memo(text)
    return _mask(text)


def is_word(token: str) -> bool:
    """A token of letters and no digit or mask: "Started", '"GET', "user=root", "a.b.C"."""
    return _VARIABLE.search(token) is None and _LETTER.search(token) is not None


def template_id(template: str) -> str:
    """Stable id of a template text: the same in every process and after restarts."""
    digest = hashlib.sha1(template.encode("utf-8"), usedforsecurity=False).hexdigest()
    return ID_PREFIX + digest[:ID_HEX_CHARS]


class _EvictingCache(LogClusterCache):
    """drain3's LRU of clusters, telling its owner which cluster it dropped."""

    def __init__(self, maxsize: int, on_evict: Callable[[int], None]) -> None:
        super().__init__(maxsize=maxsize)
        self._on_evict = on_evict

    def popitem(self) -> tuple[Any, Any]:
        key, value = super().popitem()
        self._on_evict(key)
        return key, value


class _Drain(Drain):
    """Drain whose similarity treats a differing word as a different event (see above)."""

    def __init__(self, *, depth: int, sim_th: float, max_children: int, max_clusters: int,
                 on_evict: Callable[[int], None]) -> None:
        super().__init__(depth=depth, sim_th=sim_th, max_children=max_children,
                         param_str=PARAM)
        self._on_evict = on_evict
        self.id_to_cluster = _EvictingCache(max_clusters, self._evicted)
        # cluster id -> template position -> the distinct words it refused there
        self._refused: dict[int, dict[int, set[str]]] = {}
        # word -> templates born with it (up to ENTITY_TEMPLATES)
        self._word_templates: dict[str, int] = {}

    @staticmethod
    def has_numbers(s: str) -> bool:
        # drain3 branches on a token without digits; a masked one ("host:<NUM>") is a
        # variable as much as the digits it replaced
        return _VARIABLE.search(s) is not None

    def _evicted(self, cluster_id: int) -> None:
        self._refused.pop(cluster_id, None)
        self._on_evict(cluster_id)

    def add_seq_to_prefix_tree(self, root_node: Any, cluster: LogCluster) -> None:
        super().add_seq_to_prefix_tree(root_node, cluster)
        counts = self._word_templates
        if len(counts) > MAX_WORDS:
            counts.clear()
        for token in set(cluster.log_template_tokens):
            n = counts.get(token, 0)
            if n < ENTITY_TEMPLATES and is_word(token):
                counts[token] = n + 1

    def _refuses(self, cluster_id: int, template: Sequence[str], tokens: Sequence[str]) -> bool:
        """Whether the line holds a word where the template holds another that tells
        events apart (and note the refusal)."""
        counts = self._word_templates
        for i, (a, b) in enumerate(zip(template, tokens, strict=True)):
            if (a in (b, PARAM) or counts.get(a, 0) >= ENTITY_TEMPLATES
                    or not is_word(a) or not is_word(b)):
                continue
            seen = self._refused.setdefault(cluster_id, {}).setdefault(i, set())
            if len(seen) < WORD_ESCAPE:
                seen.add(b)
                return True
        return False

    def add(self, content: str) -> LogCluster:
        """drain3's ``add_log_message`` without its profiler calls: the cluster of
        ``content`` (masked), a new one or an existing one generalised to hold it."""
        tokens = content.split()
        cluster = self.tree_search(self.root_node, tokens, self.sim_th, False)
        if cluster is None:
            self.clusters_counter += 1
            cluster = LogCluster(tokens, self.clusters_counter)
            self.id_to_cluster[cluster.cluster_id] = cluster
            self.add_seq_to_prefix_tree(self.root_node, cluster)
            return cluster
        template = cluster.log_template_tokens
        if any(a != b and a != PARAM for a, b in zip(template, tokens, strict=True)):
            cluster.log_template_tokens = tuple(
                a if a == b else PARAM for a, b in zip(template, tokens, strict=True))
        cluster.size += 1
        self.id_to_cluster[cluster.cluster_id]  # touch: most recently used
        return cluster

    def again(self, cluster_id: int) -> LogCluster | None:
        """The cluster a masked line joined before, counted once more; None once evicted.

        Joining a cluster only ever turns template tokens into ``<*>``, so a line the
        cluster already holds leaves its template as it is.
        """
        cluster = self.id_to_cluster.get(cluster_id)
        if cluster is None:
            return None
        cluster.size += 1
        self.id_to_cluster[cluster_id]  # touch: most recently used
        return cluster

    def fast_match(self, cluster_ids: Sequence[int], tokens: list[str], sim_th: float,
                   include_params: bool) -> LogCluster | None:
        best: LogCluster | None = None
        best_sim = -1.0
        best_params = -1
        n = len(tokens)
        get = self.id_to_cluster.get
        for cluster_id in cluster_ids:
            cluster = get(cluster_id)  # no LRU touch: only a candidate
            if cluster is None:
                continue
            template = cluster.log_template_tokens
            same = params = 0
            for a, b in zip(template, tokens, strict=True):
                if a == PARAM:
                    params += 1
                elif a == b:
                    same += 1
            sim = (same + params if include_params else same) / n if n else 1.0
            if sim > best_sim or (sim == best_sim and params > best_params):
                if (sim >= sim_th and same + params < n
                        and self._refuses(cluster_id, template, tokens)):
                    continue
                best, best_sim, best_params = cluster, sim, params
        return best if best_sim >= sim_th else None


class TemplateMiner:
    """Map a log message to ``(template_id, template)``; memory bounded by ``max_clusters``.

    Not thread-safe (Drain mutates its tree); use one per worker or partition.
    """

    __slots__ = ("_drain", "_ids", "_joined")

    def __init__(
        self,
        *,
        sim_th: float = DEFAULT_SIM_TH,
        depth: int = DEFAULT_DEPTH,
        max_clusters: int = DEFAULT_MAX_CLUSTERS,
        max_children: int = DEFAULT_MAX_CHILDREN,
    ) -> None:
        if not 0.0 <= sim_th <= 1.0:
            raise ValueError(f"sim_th must be in [0, 1], got {sim_th}")
        if depth < 3:
            raise ValueError(f"depth must be >= 3 (Drain needs it), got {depth}")
        if max_clusters < 1 or max_children < 1:
            raise ValueError("max_clusters and max_children must be >= 1")
        self._ids: dict[int, str] = {}  # drain3 cluster id -> the id given at its birth
        # masked line -> the cluster it joined: most lines repeat a masked line seen before
        self._joined: dict[str, int] = {}
        self._drain = _Drain(depth=depth, sim_th=sim_th, max_children=max_children,
                             max_clusters=max_clusters, on_evict=self._forget)

    def _forget(self, cluster_id: int) -> None:
        self._ids.pop(cluster_id, None)

    def match(self, message: str) -> tuple[str, str]:
        """Learn from ``message`` and return its current ``(template_id, template)``."""
        masked = mask(message)
        known = self._joined.get(masked)
        cluster = None if known is None else self._drain.again(known)
        if cluster is None:
            cluster = self._drain.add(masked)
            if len(masked) <= JOINED_MAX_CHARS:
                if len(self._joined) >= JOINED_LINES:
                    self._joined.clear()
                self._joined[masked] = cluster.cluster_id
        template = cluster.get_template()
        tid = self._ids.get(cluster.cluster_id)
        if tid is None:
            tid = self._ids[cluster.cluster_id] = template_id(template)
        return tid, template

    @property
    def cluster_count(self) -> int:
        """Clusters currently held (at most ``max_clusters``)."""
        return len(self._drain.id_to_cluster)

    @property
    def id_count(self) -> int:
        """Birth ids currently held (one per held cluster)."""
        return len(self._ids)
