"""The trace stage: each request's lines gathered by trace id, timed hop by hop.

``table`` holds the open traces and says when one is complete (pure, no Kafka);
``step`` runs it on the traces topic and sends each report its hops.
"""
