"""One template per event in a report, whatever worker or restart mined its lines.

The clean stage names a template by a hash of the text it had at its birth, and
that id holds only inside one process: the miner's state lives in memory, so two
workers sharing a source (``retro produce --spread``), or one worker after a
restart or a rebalance, mine the same event from scratch. Their first templates
differ ("Failed password for root from <IP>" here, "... for admin ..." there)
until each has seen enough lines to generalise ("Failed password for <*> from
<IP>"). Ids cannot be reconciled without shared miner state, but texts can: the
report resolves a canonical template by coverage (``streams.batch.covering``:
the same tokens, or ``<*>`` or a mask where the other has a value).

``fold_evidence`` folds every covered entry into a covering one that nothing else
covers. The result depends only on which templates are present, never on their
order, and folding a folded set changes nothing, so fragments give the same report
in any arrival order. That holds for templates that form a chain, as those of one
drain3 cluster do (its template only gains wildcards). Two limits: a template with
two generalisers that cover neither each other goes to the more general one only if
both are there when it is folded (folded earlier, it stays where it went); and only
templates that count records take part, so a fully replayed fragment (it adds
nothing) does not bring its text. Folding happens inside one incident only, so a
broad template never absorbs lines the model put in another incident.
"""

from __future__ import annotations

from collections.abc import Mapping

from streams.batch.covering import canonical_templates
from streams.batch.entities import top_entities
from streams.records import smallest_traces
from streams.report.state.minutes import add_minutes
from streams.report.state.model import OTHER_TEMPLATES, TemplateEvidence, pick_examples


def fold_evidence(evidence: Mapping[str, TemplateEvidence]) -> dict[str, TemplateEvidence]:
    """Evidence with every covered template folded into its canonical one: counts
    summed (the records of two entries never overlap), examples re-picked, entities
    and minutes summed, trace samples unioned to the smallest. ``OTHER_TEMPLATES`` is
    a bucket, not a template, and stays as it is. The input is left unchanged."""
    plain = {t: ev for t, ev in evidence.items() if t != OTHER_TEMPLATES}
    members: dict[str, list[TemplateEvidence]] = {}
    for template, root in canonical_templates(plain).items():
        members.setdefault(root, []).append(plain[template])
    out: dict[str, TemplateEvidence] = {}
    for root, group in members.items():
        if len(group) == 1:
            out[root] = group[0]
            continue
        entities: dict[str, int] = {}
        for ev in group:
            for name, n in ev.entities.items():
                entities[name] = entities.get(name, 0) + n
        out[root] = TemplateEvidence(
            template=root,
            count=sum(ev.count for ev in group),
            examples=pick_examples(x for ev in group for x in ev.examples),
            entities=top_entities(entities),
            minutes=add_minutes(*(ev.minutes for ev in group)),
            traces=smallest_traces(*(ev.traces for ev in group)),
        )
    if OTHER_TEMPLATES in evidence:
        out[OTHER_TEMPLATES] = evidence[OTHER_TEMPLATES]
    return out
