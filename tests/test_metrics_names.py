"""The metric names, labels and bucket rules deploy_lib/metrics/names.py uses, against SGLang's own.

tests/data/metrics/sglang_metrics.yaml holds the facts read from the 0.5.9 and 0.5.23 wheels (file and line per
fact). The fast tests check names.py against that file; the `wheels` test reads the wheels again and checks the file
against them. It downloads a wheel missing from the cache (tests/helpers/wheelcache.py, as every `wheels` test does:
two wheels of ~40 MB, once per machine, already there wherever the other wheel tests ran); `-m "not wheels"` leaves
it out offline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.sglang_metrics import VERSIONS, extract

from deploy_lib.metrics.names import (
    SPECS,
    BucketRuleError,
    Collector,
    Metric,
    bucket_bounds,
    default_buckets,
    label_names,
    length_histograms_need_flag,
)
from deploy_lib.release.server_args import spelling
from deploy_lib.versions import KNOWN_SGLANG

pytest_plugins = ("helpers.wheelcache",)

FIXTURE = Path(__file__).parent / "data" / "metrics" / "sglang_metrics.yaml"
FACTS: dict[str, Any] = yaml.safe_load(FIXTURE.read_text())
COLLECTOR_CLASS = {Collector.SCHEDULER: "SchedulerMetricsCollector", Collector.TOKENIZER: "TokenizerMetricsCollector"}


def test_the_fixture_covers_the_versions_and_every_metric_read() -> None:
    assert tuple(FACTS) == VERSIONS
    for version in VERSIONS:
        assert set(FACTS[version]["metrics"]) == {metric.value for metric in Metric}, version


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("metric", list(Metric))
def test_kind_collector_and_labels_are_sglangs(version: str, metric: Metric) -> None:
    fact = FACTS[version]["metrics"][metric.value]
    spec = SPECS[metric]
    assert spec.kind.value == fact["kind"]
    assert COLLECTOR_CLASS[spec.collector] == fact["collector"]
    own = FACTS[version][f"{spec.collector.value}_labels"]["keys"]
    assert label_names(metric, version) == (*own, *fact["extra_labels"])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("metric", [m for m in Metric if SPECS[m].kind.value == "histogram"])
def test_default_buckets_and_the_flag_the_length_histograms_need(version: str, metric: Metric) -> None:
    fact = FACTS[version]["metrics"][metric.value]
    assert default_buckets(metric, version) == tuple(float(b) for b in fact["buckets"])
    needs_flag = fact["only_if"] == "collect_tokens_histogram"
    assert needs_flag == (metric in (Metric.PROMPT_LENGTH, Metric.GENERATION_LENGTH)
                          and length_histograms_need_flag(version))


def test_the_releases_read_differ_where_names_py_says() -> None:
    """Guards the test above against two equal versions: the defaults, the flag and is_streaming really differ."""
    assert default_buckets(Metric.PROMPT_LENGTH, "0.5.9") != default_buckets(Metric.PROMPT_LENGTH, "0.5.23")
    assert length_histograms_need_flag("0.5.9") and not length_histograms_need_flag("0.5.23")
    assert "is_streaming" in label_names(Metric.TTFT, "0.5.23")
    assert "is_streaming" not in label_names(Metric.TTFT, "0.5.9")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_bucket_rules_are_sglangs(version: str) -> None:
    assert sorted(FACTS[version]["bucket_rules"]) == ["custom", "default", "tse"]


@pytest.mark.parametrize(("rule", "bounds"), [
    # the example in SGLang's own --prompt-tokens-buckets help (0.5.9 server_args.py, 0.5.23 fields/observability.py)
    (["tse", "1000", "2", "8"], (984.0, 992.0, 996.0, 998.0, 1000.0, 1002.0, 1004.0, 1008.0, 1016.0)),
    (["custom", "500", "10", "50", "10"], (10.0, 50.0, 500.0)),
    (["tse", "4", "2", "4"], (0.0, 2.0, 4.0, 6.0, 8.0)),     # middle - 4 floors at 0
    ([], (100.0, 300.0)),
    (["default"], (100.0, 300.0)),
])
def test_bucket_rules_give_sglangs_bounds(rule: list[str], bounds: tuple[float, ...]) -> None:
    assert bucket_bounds(rule, defaults=(300, 100, 300)) == bounds


@pytest.mark.parametrize("rule", [["tse", "1000", "1", "8"], ["tse", "1000"], ["custom"], ["linear", "1"]])
def test_a_rule_sglang_refuses_is_refused(rule: list[str]) -> None:
    with pytest.raises(BucketRuleError):
        bucket_bounds(rule, defaults=(1,))


@pytest.mark.wheels
@pytest.mark.parametrize("version", VERSIONS)
def test_the_fixture_is_what_the_wheel_says(version: str, sglang_source: Callable[[str], Path]) -> None:
    assert extract(sglang_source(version)) == FACTS[version]


@pytest.mark.parametrize("version", KNOWN_SGLANG)
def test_features_metrics_writes_the_length_histograms_flag_where_the_release_needs_it(version: str) -> None:
    """The renderer's spelling of features.metrics (versions.SPELLINGS) and names.py agree on every known release."""
    argv = spelling("metrics", version)
    assert argv is not None and argv.argv[0] == "--enable-metrics"
    assert ("--collect-tokens-histogram" in argv.argv) == length_histograms_need_flag(version)
