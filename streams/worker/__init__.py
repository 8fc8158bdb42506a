"""The worker's Kafka wiring: each stage's step on the stage runtime, and the web views.

stages.py  the four stage loops (clean, lanes, re-drive, compactor), their consumer
           groups and topics, and the Kafka readers their steps are given
web.py     the HTTP views and metrics on faust's web server
"""
