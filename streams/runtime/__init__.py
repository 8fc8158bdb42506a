"""The stage runtime: one way to consume a fetch, step it, send, and commit.

step.py     what a step sees (Message, Out, Context) and the Step base class
context.py  one membership's ledger: records done, deliveries in flight, failure
acks.py     acks in offset order, whatever order the work finishes in
loop.py     StageLoop: the runtime on aiokafka (group, rebalance, rejoin, drain)
memory.py   MemoryRun: the runtime in memory, for testing steps without a broker
turns.py    taking turns on the worker's one event loop
"""
