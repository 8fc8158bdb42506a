"""Telling the on-call: incidents to Alertmanager and a chat webhook as they open,
escalate and end, each change once, whatever the workers, restarts and re-reads.

incidents.py  a report's incidents of the day as alerts, redacted
ledger.py     what was decided and delivered per report, and deciding the next change
messages.py   Alertmanager v2 alerts and Slack-compatible chat messages
sinks.py      posting them, with retries and backoff, counted per sink and outcome
step.py       NotifyStep: plans on report versions, records, sends off the commit path
"""
