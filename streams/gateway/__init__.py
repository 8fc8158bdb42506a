"""The model gateway: batches to fragments within a provider's limits (pure asyncio).

``Gateway.analyze(batch)`` (``streams.gateway.gateway``) is the one entry point; the
limiter, buckets, retry budget, cache and backend are built by the composition root
(``streams.gateway.factory``) and passed in.
"""
