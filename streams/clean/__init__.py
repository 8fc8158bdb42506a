"""Clean stage: detect the format of a raw record, parse, redact, template, cost, route."""
