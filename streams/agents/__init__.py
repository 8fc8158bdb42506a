"""faust agents: thin wiring between Kafka topics and the pure stages.

clean.py      retro.logs.raw -> Cleaner -> retro.records.fast | .slow | retro.deadletter
batch.py      retro.records.{fast,slow} -> LaneProcessor(TokenWindow, Gateway)
              -> retro.fragments | retro.review
compactor.py  retro.fragments -> merge() in a changelogged table -> retro.reports
"""
