"""Soak: a seeded mix of well- and badly-behaved requests through one pool with two workers.

Two profiles of the same test:

* short (CI, by default): ``SHORT`` results after the warm-up, or ``PYNOX_SOAK_JOBS`` if set;
* long (by hand): ``python -m pytest -m slow tests/soak``, 10,000 results after the warm-up.

``PYNOX_SOAK_SEED`` changes the mix; ``PYNOX_SOAK_REPORT=path.json`` writes the figures
that docs/reliability.md reports.

What is proven, for every request of the mix: exactly one answer, with the planned outcome. For
the pool as a whole: its counters equal the plan's, one log line per result and nothing else on
its stderr (no traceback), its templates never replaced, and between two idle moments (after the
warm-up, after the run) its RSS and its templates' within 10%, the same descriptors and threads,
no zombie and no stray process; once it exits, nothing is left.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.pool.pool_driver import PREPARED_PER_WORKER, pool_process

from .driver import Driver, Snapshot, Tally, idle_snapshot
from .mix import FILES, draw

WORKERS = 2
SHORT = 1000
LONG = 10_000
SEED = int(os.environ.get("PYNOX_SOAK_SEED", "8"))
OUTCOMES = ("ok", "failed", "timeouts", "signals", "setup_errors", "request_errors", "worker_errors")
RSS_DRIFT = 0.10
PIDFD = "anon_inode:[pidfd]"


def _warmup_size(results: int) -> int:
    # Enough of every kind that the allocators of the pool and its templates reach their steady state.
    return min(max(results // 4, 300), 1000)


def _drift(before: int, after: int) -> float:
    return (after - before) / before


def _compare_idle(warm: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Like with like: two idle moments of the same pool, the same templates, after the same kinds of work."""
    assert sorted(after.template_rss_kb) == sorted(warm.template_rss_kb), "a template was replaced during the soak"
    drift = {"pool": _drift(warm.pool_rss_kb, after.pool_rss_kb)}
    drift |= {f"template {i}": _drift(warm.template_rss_kb[pid], after.template_rss_kb[pid])
              for i, pid in enumerate(sorted(warm.template_rss_kb))}
    figures = {"rss_kb_after_warmup": {"pool": warm.pool_rss_kb, "templates": list(warm.template_rss_kb.values())},
               "rss_kb_after_run": {"pool": after.pool_rss_kb, "templates": list(after.template_rss_kb.values())},
               "rss_drift_percent": {name: round(100 * value, 2) for name, value in drift.items()}}
    assert all(abs(value) <= RSS_DRIFT for value in drift.values()), figures
    # A worker holds the pidfds of the children prepared ahead of its next job (the pool's default number at
    # most; a job's is released before the worker idles) and of its template (forked from the zygote, see
    # zygote.py); and once the pool has had a session, its handle on the session template waiting for the next
    # session (forked from the zygote too) and on the child that template confined for it: two more.
    warm_fds, after_fds = Counter(warm.pool_fds), Counter(after.pool_fds)
    bound = WORKERS * (PREPARED_PER_WORKER + 1) + 2
    assert after_fds[PIDFD] <= bound and warm_fds[PIDFD] <= bound, (warm_fds, after_fds)
    del warm_fds[PIDFD], after_fds[PIDFD]
    assert after_fds == warm_fds, f"the pool's descriptors changed: {warm.pool_fds} -> {after.pool_fds}"
    assert after.template_fds == warm.template_fds, "a template's descriptors changed"
    assert after.pool_threads == warm.pool_threads, f"threads {warm.pool_threads} -> {after.pool_threads}"
    figures["pool_descriptors"] = sum(after.pool_fds.values())
    figures["pool_threads"] = after.pool_threads
    return figures


def soak(workdir: Path, results: int, seed: int) -> dict[str, Any]:
    (workdir / FILES).mkdir()
    warm_plan = draw(seed, _warmup_size(results), "warm")
    plan = draw(seed + 1, results, "soak")
    tally = Tally()
    started = time.monotonic()
    with pool_process(f"--workers={WORKERS}", "--log=json", cwd=workdir) as pool:
        driver = Driver(pool, WORKERS, tally)
        driver.run(warm_plan)
        warm = idle_snapshot(pool, WORKERS, spare_prepared=True)
        run_started = time.monotonic()
        driver.run(plan)
        run_seconds = time.monotonic() - run_started
        after = idle_snapshot(pool, WORKERS, spare_prepared=True)
        stats = pool.stats()

        where = f"(seed {seed})"
        assert not tally.problems, f"{len(tally.problems)} results differ from the plan {where}: {tally.problems[:20]}"
        assert driver.unanswered() == [], f"requests never answered {where}: {driver.unanswered()[:20]}"
        planned_ids = {step.fields["id"] for p in (warm_plan, plan)
                       for step in [*p.jobs, *(s for sc in p.scenarios for s in sc.steps)]}
        assert set(driver.answers) == planned_ids and set(driver.answers.values()) == {1}, where
        assert tally.results == warm_plan.results + plan.results + tally.late_replies, where
        # The counters add up to the mix the plan drew, outcome by outcome and error type by error type.
        assert {name: stats[name] for name in OUTCOMES} == {name: tally.outcomes[name] for name in OUTCOMES}, where
        assert stats["jobs"] == tally.results, where
        assert stats["errors"] == dict(tally.errors), where
        assert stats["host_calls"] == tally.host_calls, where
        assert stats["sessions_active"] == 0, where
        # Idle: nothing running, waiting or unanswered; every result that ran is in the latency histograms.
        assert (stats["busy_workers"], stats["queued"], stats["in_flight"]) == (0, 0, 0), where
        timed = tally.results - tally.outcomes["request_errors"]
        assert stats["duration_seconds"]["count"] == stats["queue_seconds"]["count"] == timed, where
        figures = _compare_idle(warm, after)
    # The pool has exited 0 and left nothing behind (pool_process checks both); its stderr is complete.
    log = [line for line in bytes(pool.stderr).splitlines() if line.strip()]
    parsed = [json.loads(line) for line in log if line.startswith(b"{")]
    assert len(parsed) == len(log), f"the pool wrote something else than log lines: {log[:5]}"
    # One line per job, and the pool's own lifecycle once each (EOF ends it: a drain, no signal).
    assert Counter(line.get("event") for line in parsed) == {"job": tally.results, "start": 1, "ready": 1,
                                                              "drain": 1, "exit": 1}
    queue_us = tally.queue_us
    return {
        "seed": seed,
        "workers": WORKERS,
        "results": tally.results,
        "planned_results": {"warmup": warm_plan.results, "run": plan.results},
        "results_lost": warm_plan.results + plan.results - (tally.results - tally.late_replies),
        "kinds": dict(warm_plan.kinds() + plan.kinds()),
        "outcomes": {name: stats[name] for name in OUTCOMES},
        "errors": stats["errors"],
        "host_calls": stats["host_calls"],
        "late_replies_refused": tally.late_replies,
        "seconds": round(time.monotonic() - started, 1),
        "run_seconds": round(run_seconds, 1),
        "queue_ms_median": round(statistics.median(queue_us) / 1000, 2),
        "queue_ms_p99": round(statistics.quantiles(queue_us, n=100)[98] / 1000, 2),
        **figures,
    }


def _report(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, indent=1, sort_keys=True))
    target = os.environ.get("PYNOX_SOAK_REPORT")
    if target:
        Path(target).write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")


@pytest.mark.timeout(900)
def test_soak_short(tmp_path: Path) -> None:
    _report(soak(tmp_path, int(os.environ.get("PYNOX_SOAK_JOBS", SHORT)), SEED))


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_soak_long(tmp_path: Path) -> None:
    _report(soak(tmp_path, LONG, SEED))
