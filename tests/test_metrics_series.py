"""A labelled series looked up once counts into the same Prometheus series as labels()."""

from __future__ import annotations

from streams.metrics import Metrics, Series


def test_series_children_are_the_labelled_series_of_the_registry() -> None:
    metrics = Metrics()
    by_format = Series(metrics.records_by_format)
    by_format("json").inc()
    by_format("json").inc()
    by_format("syslog").inc()
    metrics.records_by_format.labels(format="json").inc()
    get = metrics.registry.get_sample_value
    assert get("retro_records_format_total", {"format": "json"}) == 3
    assert get("retro_records_format_total", {"format": "syslog"}) == 1
    assert by_format("json") is by_format("json")
