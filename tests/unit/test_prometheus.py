"""The Prometheus text format as the official parser (prometheus_client) reads it."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from torchdoctor.probe.metrics import Family
from torchdoctor.report.prometheus import render


def test_escapes_and_special_values_round_trip() -> None:
    odd = 'a "quoted" back\\slash\nnewline'
    families = [
        Family("td_gauge", "gauge", "help with \\ and\nnewline", [({"rank": "0", "x": odd}, 1.5)]),
        Family(
            "td_values", "gauge", "values", [({"v": "nan"}, math.nan), ({"v": "inf"}, math.inf)]
        ),
        Family("td_count", "counter", "a counter", [({"rank": "1"}, 3.0)]),
    ]
    parsed = {f.name: f for f in text_string_to_metric_families(render(families))}
    [sample] = parsed["td_gauge"].samples
    assert sample.labels == {"rank": "0", "x": odd} and sample.value == 1.5
    assert parsed["td_gauge"].documentation == "help with \\ and\nnewline"
    values = {s.labels["v"]: s.value for s in parsed["td_values"].samples}
    assert math.isnan(values["nan"]) and values["inf"] == math.inf
    assert parsed["td_count"].type == "counter"
    assert [(s.name, s.value) for s in parsed["td_count"].samples] == [("td_count_total", 3.0)]
