"""Served traffic, read from SGLang's `/metrics` (`features.metrics`, `--enable-metrics`), as pure data.

    names       the metrics the tool reads, their labels and bucket rules per SGLang release (checked against the
                wheels: tests/test_metrics_names.py)
    exposition  one scrape parsed (prometheus_client's parser) into typed samples; histograms and their quantiles
    window      two scrapes -> the window's figures: TTFT / inter-token / e2e percentiles, throughput, load
    watch       the watch's verdict: the old release's window against the new one's (issue 42)

Nothing here reads a server: the caller scrapes (a host step) and hands the text in.
"""

from deploy_lib.metrics.exposition import ExpositionError, Histogram, Sample, Scrape, parse_scrape
from deploy_lib.metrics.names import Metric
from deploy_lib.metrics.window import Percentiles, WindowFigures, window_figures

__all__ = ["ExpositionError", "Histogram", "Metric", "Percentiles", "Sample", "Scrape", "WindowFigures",
           "parse_scrape", "window_figures"]
