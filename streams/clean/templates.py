"""Log template mining (Drain, via drain3) with template ids that survive restarts.

Why templates: a batch sends one entry per (service, template) with a count, so
thousands of "Receiving block <BLK> src: <IP> dest: <IP>" lines cost one line of
prompt. Why our own ids: drain3's cluster ids are per-process counters, so two
workers (or one worker after a restart) would give the same template different
ids. The id here is a hash of the template text instead: the same text gets the
same id in every process. A cluster's template can still generalize as it sees
more lines; the masks below make that rare by replacing the usual variables
(block ids, IPs, paths, hex, numbers) before Drain sees the line.

Nothing is persisted and no ``drain3.ini`` is read from the working directory:
the configuration is built in code.
"""

from __future__ import annotations

import hashlib
import logging
import re

from drain3 import TemplateMiner as _DrainMiner
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

logger = logging.getLogger(__name__)

DEFAULT_SIM_TH = 0.4
DEFAULT_DEPTH = 4
DEFAULT_MAX_CLUSTERS = 5000
DEFAULT_MAX_CHILDREN = 100
ID_PREFIX = "t"
ID_HEX_CHARS = 10

_B = r"(?<![A-Za-z0-9_])"  # not inside a word
_E = r"(?![A-Za-z0-9_])"

_DIGIT = "digit"  # a hint: the text holds a digit (every mask below but PATH needs one)

# (pattern, mask name, hints) in the order applied; earlier masks protect their text
# from later ones. A mask runs only when its text holds one of its hints: most lines
# need few of the eight substitutions, which were an eighth of the clean stage's CPU.
MASKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # HDFS block ids, and a run of them ("delete blk_1 blk_2 ...") as one token so
    # the number of blocks does not change the template.
    (r"(?<![\w/])blk_-?\d+(?:[ ,]+blk_-?\d+)*", "BLK", ("blk_",)),
    (
        _B + r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" + _E,
        "UUID", ("-",),
    ),
    (r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\w.])", "IP", (".",)),
    (_B + r"(?:[0-9A-Fa-f]{2}:){5,}[0-9A-Fa-f]{2}" + _E, "MAC", (":",)),
    (r"(?<![\w/<>*])(?:/[\w.\-]+){2,}/?", "PATH", ("/",)),
    (_B + r"0[xX][0-9a-fA-F]+" + _E, "HEX", ("0x", "0X")),
    # bare hex of 8+ with a letter and a digit: object hashes, trace and session ids
    (_B + r"(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}" + _E, "HEX",
     (_DIGIT,)),
    (r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:ms|us|ns|s|[KMGT]i?B|B)?(?![\w.])", "NUM", (_DIGIT,)),
)
_HAS_DIGIT = re.compile(r"\d")


class HintedMask(MaskingInstruction):
    """A drain3 masking instruction that skips its substitution when the text holds
    none of its hints (substrings every match contains)."""

    def __init__(self, pattern: str, mask_with: str, hints: tuple[str, ...]) -> None:
        super().__init__(pattern, mask_with)
        self.hints = tuple(h for h in hints if h != _DIGIT)
        self.needs_digit = _DIGIT in hints

    def mask(self, content: str, mask_prefix: str, mask_suffix: str) -> str:
        if self.needs_digit:
            if _HAS_DIGIT.search(content) is None:
                return content
        elif not any(h in content for h in self.hints):
            return content
        return super().mask(content, mask_prefix, mask_suffix)


def template_id(template: str) -> str:
    """Stable id of a template text: the same in every process and after restarts."""
    digest = hashlib.sha1(template.encode("utf-8"), usedforsecurity=False).hexdigest()
    return ID_PREFIX + digest[:ID_HEX_CHARS]


def build_config(
    *,
    sim_th: float = DEFAULT_SIM_TH,
    depth: int = DEFAULT_DEPTH,
    max_clusters: int = DEFAULT_MAX_CLUSTERS,
    max_children: int = DEFAULT_MAX_CHILDREN,
) -> TemplateMinerConfig:
    """A drain3 configuration built in code (``TemplateMinerConfig()`` reads no file)."""
    config = TemplateMinerConfig()
    config.drain_sim_th = sim_th
    config.drain_depth = depth
    config.drain_max_clusters = max_clusters
    config.drain_max_children = max_children
    config.masking_instructions = [HintedMask(p, name, hints) for p, name, hints in MASKS]
    config.profiling_enabled = False
    return config


class TemplateMiner:
    """Map a log message to ``(template_id, template)``; memory bounded by ``max_clusters``.

    Not thread-safe (Drain mutates its tree); use one per worker or partition.
    """

    __slots__ = ("_ids", "_miner")

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
        _quiet_drain3()
        config = build_config(
            sim_th=sim_th, depth=depth, max_clusters=max_clusters, max_children=max_children
        )
        # persistence_handler=None: no snapshots; config given: no drain3.ini lookup.
        self._miner = _DrainMiner(persistence_handler=None, config=config)
        self._ids: dict[int, str] = {}  # drain3 cluster id -> the id given at its birth

    def match(self, message: str) -> tuple[str, str]:
        """Learn from ``message`` and return its current ``(template_id, template)``."""
        result = self._miner.add_log_message(message)
        template: str = result["template_mined"]
        cluster = result["cluster_id"]
        tid = self._ids.get(cluster)
        if tid is None:
            tid = self._ids[cluster] = template_id(template)
        return tid, template

    @property
    def cluster_count(self) -> int:
        """Clusters currently held (at most ``max_clusters``)."""
        return len(self._miner.drain.clusters)


def _quiet_drain3() -> None:
    """drain3 logs INFO on start and per snapshot; keep it at WARNING unless someone chose."""
    drain_logger = logging.getLogger("drain3")
    if drain_logger.level == logging.NOTSET:
        drain_logger.setLevel(logging.WARNING)
