"""The stage loops, each an aiokafka consumer group run as a task of the worker.

clean.py      retro.logs.raw -> Cleaner -> retro.records.fast | .slow | retro.deadletter
batch.py      retro.records.{fast,slow} -> LaneProcessor(TokenWindow, Gateway)
              -> retro.fragments | retro.review
compactor.py  retro.fragments -> fold() into reports loaded from retro.reports -> retro.reports
redrive.py    retro.review (transient reasons) -> raw records again -> the lanes
"""
