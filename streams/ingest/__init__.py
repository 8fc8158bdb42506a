"""Ingest: files or stdin -> logical records (multi-line joined) -> the raw topic."""
