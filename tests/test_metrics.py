"""The stats' histograms and gauges, the Prometheus text they are served as, and the metrics_socket setting.

Pure: results are built as the pool builds them, no process is started. The same numbers through a real
saturated pool are in tests/pool/test_pool_saturation.py.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pynox.cli import build_parser
from pynox.config import load_config, pool_options
from pynox.errors import ConfigError
from pynox.protocol import Result, StatsEvent, decode_answer, encode, refusal
from pynox.server.metrics import render
from pynox.server.stats import DURATION_BUCKETS, QUEUE_BUCKETS, Gauges, Stats
from pynox.wire.spec import ErrorInfo

pytestmark = pytest.mark.pure

IDLE = Gauges(busy_workers=0, queued=0, queue_capacity=3, in_flight=0, sessions_active=0, max_sessions=16,
              draining=False)


def _result(duration_us: int, queue_us: int = 0, error: str | None = None) -> Result:
    info = ErrorInfo(type=error, message="m") if error else None
    return Result(id=1, exit=1 if error else 0, error=info, duration_ms=duration_us // 1000,
                  duration_us=duration_us, queue_us=queue_us)


def test_a_value_on_a_bound_is_in_that_bucket_and_buckets_are_cumulative() -> None:
    stats = Stats(1)
    for us in (5_000, 5_001, 10_000, 400_000_000):  # on the first bound, just above it, on the second, above all
        stats.record(_result(us, queue_us=us))
    duration = stats.snapshot(None, IDLE).duration_seconds
    assert duration.le == list(DURATION_BUCKETS)
    assert duration.counts[:3] == [1, 3, 3] and duration.counts[-1] == 3 and duration.count == 4
    assert duration.sum == pytest.approx((5_000 + 5_001 + 10_000 + 400_000_000) / 1e6)
    waits = stats.snapshot(None, IDLE).queue_seconds
    assert waits.le == list(QUEUE_BUCKETS) and waits.count == 4 and waits.counts[-1] == 3


def test_percentiles_can_be_read_off_the_buckets() -> None:
    stats = Stats(1)
    for _ in range(98):
        stats.record(_result(3_000))  # 3 ms
    stats.record(_result(700_000))  # 0.7 s
    stats.record(_result(20_000_000))  # 20 s
    histogram = stats.snapshot(None, IDLE).duration_seconds

    def quantile(q: float) -> float:
        return next(bound for bound, count in zip(histogram.le, histogram.counts, strict=True)
                    if count >= q * histogram.count)

    assert (quantile(0.5), quantile(0.98), quantile(0.99), quantile(1.0)) == (0.005, 0.005, 1.0, 30.0)


def test_a_refusal_is_counted_but_not_timed() -> None:
    stats = Stats(1)
    stats.record(refusal(1, "no"))
    stats.record(_result(2_000, error="NameError"))
    snapshot = stats.snapshot(None, IDLE)
    assert (snapshot.jobs, snapshot.request_errors, snapshot.failed) == (2, 1, 1)
    assert snapshot.duration_seconds.count == snapshot.queue_seconds.count == 1


def test_gauges_template_restarts_pid_and_version_are_in_the_snapshot() -> None:
    stats = Stats(4, version="9.9")
    stats.record_template_restart()
    gauges = Gauges(busy_workers=4, queued=7, queue_capacity=12, in_flight=13, sessions_active=2, max_sessions=3,
                    draining=True)
    snapshot = stats.snapshot("s", gauges)
    assert (snapshot.busy_workers, snapshot.queued, snapshot.queue_capacity, snapshot.in_flight) == (4, 7, 12, 13)
    assert (snapshot.sessions_active, snapshot.max_sessions, snapshot.draining) == (2, 3, True)
    assert snapshot.template_restarts == 1 and snapshot.version == "9.9" and snapshot.pid > 0
    # The line decodes back to the same event, and a pool too old to send the new fields still decodes.
    assert decode_answer(encode(snapshot)) == snapshot
    old = (b'{"id":"s","event":"stats","uptime_ms":1,"workers":1,"sessions_active":0,"jobs":0,"ok":0,"failed":0,'
           b'"timeouts":0,"signals":0,"setup_errors":0,"request_errors":0,"worker_errors":0,"cancelled":0,'
           b'"host_calls":0,"duration_ms_total":0,"queue_us_total":0,"errors":{}}')
    decoded = decode_answer(old)
    assert isinstance(decoded, StatsEvent) and decoded.busy_workers == 0 and decoded.duration_seconds.count == 0


_LINE = re.compile(r'^(# (HELP|TYPE) [a-z_]+ .+|[a-z_]+(\{([a-z_]+="([^"\\\n]|\\[\\"n])*",?)+\})? [-+0-9.eInf]+)$')


def test_the_exposition_is_well_formed_and_escapes_what_a_job_named() -> None:
    stats = Stats(2, version="1.2")
    # A job names its own exception classes: a quote, a backslash or a line feed must not forge a sample.
    forged = 'Evil"} 1\npynox_workers_busy{x="'
    stats.record(_result(1_000, error=forged))
    stats.record(_result(1_000, error="back\\slash"))
    text = render(stats.snapshot(None, IDLE)).decode()
    lines = text.splitlines()
    assert text.endswith("\n") and all(_LINE.match(line) for line in lines), [
        line for line in lines if not _LINE.match(line)]
    assert [line for line in lines if line.startswith("pynox_workers_busy")] == ["pynox_workers_busy 0"]
    assert 'pynox_errors_total{type="Evil\\"} 1\\npynox_workers_busy{x=\\""} 1' in lines
    assert 'pynox_errors_total{type="back\\\\slash"} 1' in lines
    families = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(families) == len(set(families))
    for family in families:  # each family's HELP and TYPE come before its samples
        first = next(i for i, line in enumerate(lines) if not line.startswith("#") and line.startswith(family))
        assert lines[first - 1].startswith(f"# TYPE {family} ") or lines[first - 1].startswith(family)
    assert 'pynox_job_duration_seconds_bucket{le="+Inf"} 2' in lines
    assert "pynox_job_duration_seconds_count 2" in lines and 'pynox_info{version="1.2",pid="' in text
    assert sum(float(line.split()[-1]) for line in lines if line.startswith("pynox_jobs_total{")) == 2


def _pool_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["pool", *argv])


def test_metrics_socket_in_the_pool_table_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    config = tmp_path / "pynox.toml"
    config.write_text('[pool]\nmetrics_socket = "run/m.sock"\n')
    assert load_config(config).pool.metrics_socket == str(tmp_path.resolve() / "run" / "m.sock")
    assert pool_options(_pool_args("--config", str(config))).metrics_socket == str(tmp_path.resolve() / "run/m.sock")
    # The flag wins, relative to the working directory.
    flag = pool_options(_pool_args("--config", str(config), f"--metrics-socket={tmp_path}/other.sock"))
    assert flag.metrics_socket == str(tmp_path.resolve() / "other.sock")
    assert pool_options(_pool_args()).metrics_socket is None


@pytest.mark.parametrize(("value", "words"), [
    ('"missing/m.sock"', "does not exist"),
    ('"run/"', "names a directory"),
    ("3", "expected a path"),
    ('"run/' + "x" * 120 + '"', "107 bytes"),
])
def test_a_bad_metrics_socket_names_the_file_and_key(tmp_path: Path, value: str, words: str) -> None:
    (tmp_path / "run").mkdir()
    config = tmp_path / "pynox.toml"
    config.write_text(f"[pool]\nmetrics_socket = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value).startswith(f"{config}: [pool] metrics_socket: ") and words in str(caught.value)


def test_a_bad_metrics_socket_flag_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--metrics-socket: the directory of .* does not exist"):
        pool_options(_pool_args(f"--metrics-socket={tmp_path}/missing/m.sock"))
