"""Request-to-result latency and throughput of a real ``pynox pool``, beside baselines in the same run.

Drives the pool through its JSON Lines protocol over pipes, exactly as a client
would. For each case it reports the median (p50) and p99 over many runs:

* ``print(1)`` on the pool, back to back and 20 ms apart (an agent's think time), beside
  ``subprocess.run([python, "-c", code])``;
* a small pandas operation with pandas preloaded, beside a cold ``python -c "import pandas; ..."``;
* a host-function round trip (one call, and four from threads at once) and a session step, beside a
  plain pool job;
* throughput of trivial jobs with 2 workers, pipelined;
* cancel to free: with one worker busy on a long job, the time from sending ``{"cancel": ...}`` to
  the result of a trivial job sent right after it (beside that trivial job alone);
* the first step of a new session, and the private memory of a ``print(1)`` job's process;
* in-process baselines a framework user compares with: smolagents' ``LocalPythonExecutor`` (unconfined, in
  this process) on ``print(1)`` and on the pandas snippet, and pydantic-monty running ``print(1)``;
* the closest peer on the same kernel primitives: ``sandlock`` (Landlock and seccomp) running the same
  ``python -c print(1)``, from the bench-only dependency group (``pip install -r bench/requirements.txt``).

Each baseline's ratio to the pool case it stands beside is reported under ``ratios``.

``--scaling`` adds the scaling tables: throughput and ``print(1)`` latency with 1, 2, 4 and 8 workers; steps
per second and memory with 1, 10 and 100 concurrent sessions; and the p50 as the code and its output grow
(1 KB, 100 KB, 1 MB).

    python bench/latency.py [--runs 300] [--json bench/results.json] [--compare CHECKOUT [--only-compare]
                            [--compare-workers N] [--compare-config FILE] [--compare-all]]
                            [--scaling]

``--compare`` names another checkout of this repository (for example a ``git worktree`` of the
previous main): its ``print(1)`` cases run in the same process, interleaved round by round with this
checkout's, so both see the same machine load. Each case also gives ``cpu_ms_per_job``: the CPU time of
all the pool's processes (the pool, its templates and the children they reaped, from /proc) over its
rounds, divided by the jobs run in them (a clock tick is 10 ms: hundreds of jobs make it exact enough).
``--compare-all`` adds the same comparison for the pandas snippet (pools with pandas preloaded), for a step
of an open session (its process's CPU counted while it lives), and each idle pool's memory.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

PANDAS_CODE = "import pandas as pd\ndf = pd.DataFrame({'a': range(100), 'b': range(100)})\nprint(df.a.sum())"


class PoolDriver:
    """A minimal JSONL client: one request at a time, or a pipelined batch."""

    def __init__(self, *args: str, source: str | None = None) -> None:
        env = dict(os.environ)
        if source is not None:  # another checkout's pynox, ahead of the installed one
            env["PYTHONPATH"] = os.path.join(source, "packages", "pynox-core", "src")
        # Buffered: unbuffered, readline() would read the result one byte (one system call) at a time, and
        # the bench would time its own reading (a 1 MB output took a second that way).
        self.proc = subprocess.Popen([sys.executable, "-m", "pynox", "pool", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        assert self.stdin is not None and self.stdout is not None
        ready = json.loads(self.stdout.readline())
        assert ready["event"] == "ready", ready
        self.ids = 0

    def request(self, message: dict[str, Any],
                on_call: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
        self.ids += 1
        assert self.stdin is not None and self.stdout is not None
        self.send(json.dumps({"id": self.ids, **message}).encode() + b"\n")
        while True:
            reply = json.loads(self.stdout.readline())
            if reply.get("event") == "call" and on_call is not None:
                self.send(json.dumps({"reply": {"call_id": reply["call_id"],
                                                "result": on_call(reply)}}).encode() + b"\n")
                continue
            if reply.get("id") == self.ids and reply.get("event") not in ("stream", "display_data"):
                return reply  # output events (a request with stream) come before it

    def batch(self, code: str, count: int) -> float:
        """Send ``count`` jobs while reading results; return the seconds until the last result."""
        assert self.stdin is not None and self.stdout is not None
        lines = b"".join(json.dumps({"id": f"b{i}", "code": code}).encode() + b"\n" for i in range(count))
        start = time.perf_counter()
        writer = __import__("threading").Thread(target=self.send, args=(lines,))
        writer.start()
        for _ in range(count):
            reply = json.loads(self.stdout.readline())
            assert reply["exit"] == 0, reply
        writer.join()
        return time.perf_counter() - start

    def cancel_then_next(self) -> float:
        """Start a long job, cancel it once it runs, send a trivial job: seconds from the cancel to that
        job's result (the worker was busy until the cancel freed it)."""
        assert self.stdin is not None and self.stdout is not None
        self.ids += 1
        slow, job = f"slow{self.ids}", f"next{self.ids}"
        self.send(json.dumps({"id": slow, "code": "import time\ntime.sleep(30)"}).encode() + b"\n")
        time.sleep(0.05)  # it is running by now
        start = time.perf_counter()
        self.send(json.dumps({"id": f"c{self.ids}", "cancel": slow}).encode() + b"\n"
                  + json.dumps({"id": job, "code": "pass"}).encode() + b"\n")
        while True:
            reply = json.loads(self.stdout.readline())
            if reply.get("id") == slow:
                assert reply["error"]["type"] == "CancelledError", reply
            if reply.get("id") == job:
                assert reply["exit"] == 0, reply
                return time.perf_counter() - start

    def send(self, data: bytes) -> None:
        assert self.stdin is not None
        self.stdin.write(data)
        self.stdin.flush()

    def close(self) -> None:
        assert self.stdin is not None
        self.stdin.close()
        self.proc.wait(timeout=60)


def timed(fn: Callable[[], object], runs: int, warmup: int = 5, pause: float = 0.0) -> list[float]:
    """Milliseconds per call; ``pause`` seconds between calls (not timed), as an agent's think time."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        if pause:
            time.sleep(pause)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
            "runs": len(ordered)}


def check_ok(reply: dict[str, Any]) -> None:
    assert reply["exit"] == 0, reply


def compare(other: str, runs: int, workers: int = 2, config: str | None = None) -> dict[str, dict[str, float]]:
    """``print(1)`` on this checkout's pool and on ``other``'s, interleaved in rounds of 20 requests, with the
    CPU each pool spent per job: all its processes (the pool, its templates and every child they reaped),
    from /proc, over the same rounds (bench/host_calls.py's ``pool_cpu``)."""
    from host_calls import pool_cpu  # type: ignore[import-not-found]  # run from bench/

    # A config for this checkout's pool only: the other's may not know its keys.
    pools = {"this": PoolDriver(f"--workers={workers}", *([f"--config={config}"] if config else [])),
             "other": PoolDriver(f"--workers={workers}", source=other)}
    modes = {"back to back": 0.0, "10 ms apart": 0.01, "20 ms apart": 0.02}
    samples: dict[str, list[float]] = {f"{name} {mode}": [] for name in pools for mode in modes}
    ticks: dict[str, int] = dict.fromkeys(samples, 0)
    jobs: dict[str, int] = dict.fromkeys(samples, 0)
    for _ in range(max(runs // 20, 1)):
        for name, pool in pools.items():
            job = functools.partial(pool.request, {"code": "print(1)"})
            for mode, pause in modes.items():
                before = pool_cpu(pool.proc.pid)
                samples[f"{name} {mode}"] += timed(lambda job=job: check_ok(job()), 20, warmup=2, pause=pause)
                ticks[f"{name} {mode}"] += pool_cpu(pool.proc.pid) - before
                jobs[f"{name} {mode}"] += 22
    for pool in pools.values():
        pool.close()
    label = os.path.basename(other.rstrip("/"))
    results = {f"compare print(1), {key.replace('other', label)}": summary(values) for key, values in samples.items()}
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    for key in samples:
        results[f"compare print(1), {key.replace('other', label)}"]["cpu_ms_per_job"] = round(
            ticks[key] * tick_ms / jobs[key], 3)
    return results


def compare_rest(other: str, runs: int, workers: int = 1) -> dict[str, dict[str, float]]:
    """The rest of issue 46's targets against ``other``, interleaved in rounds as :func:`compare`: the pandas
    snippet on pools with pandas preloaded (20 ms apart), a step of an open session (10 ms apart), with each
    pool's CPU per job, and what each idle pool holds once warm (proportional set size of all its processes,
    so pages shared with the template count once)."""
    from host_calls import pool_cpu  # type: ignore[import-not-found]  # run from bench/

    label = os.path.basename(other.rstrip("/"))
    results: dict[str, dict[str, float]] = {}
    cases = {"pandas op (preloaded), 20 ms apart": (("--preload=pandas",), 0.02),
             "session step, 10 ms apart": ((), 0.01)}
    for case, (extra, pause) in cases.items():
        pools = {"this": PoolDriver(f"--workers={workers}", *extra),
                 label: PoolDriver(f"--workers={workers}", *extra, source=other)}
        samples: dict[str, list[float]] = {name: [] for name in pools}
        ticks = dict.fromkeys(pools, 0)
        jobs = dict.fromkeys(pools, 0)
        if case.startswith("session"):
            for pool in pools.values():
                check_ok(pool.request({"session": "bench", "code": "x = 0", "open": True}))
        for _ in range(max(runs // 20, 1)):
            for name, pool in pools.items():
                message = ({"session": "bench", "code": "x += 1"} if case.startswith("session")
                           else {"code": PANDAS_CODE})
                before = pool_cpu(pool.proc.pid) + live_sessions_cpu(pool.proc.pid)
                samples[name] += timed(lambda pool=pool, message=message: check_ok(pool.request(message)), 20,
                                       warmup=2, pause=pause)
                ticks[name] += pool_cpu(pool.proc.pid) + live_sessions_cpu(pool.proc.pid) - before
                jobs[name] += 22
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        time.sleep(1)  # idle: the next children prepared, nothing running
        for name, pool in pools.items():
            figures = summary(samples[name])
            figures["cpu_ms_per_job"] = round(ticks[name] * tick_ms / jobs[name], 3)
            if not case.startswith("session"):
                # Read while both pools run: the pages they share (libpython's, a preload's libraries) count
                # half in each. Read after the other closed, a pool counted them whole, ~9 MB more with pandas.
                figures["idle_pool_pss_mb"] = tree_rss_mb(pool.proc.pid)
            results[f"compare {case}, {name}"] = figures
        for pool in pools.values():
            pool.close()
    return results


def live_sessions_cpu(pid: int) -> int:
    """CPU ticks of the pool's live session processes (their steps are theirs; ``pool_cpu`` counts a process
    once it is reaped)."""
    from host_calls import cpu_ticks  # type: ignore[import-not-found]  # run from bench/

    ticks = 0
    for process in descendants(pid):
        try:
            if process_name(process) == "pynox-session":
                ticks += cpu_ticks(process, reaped=False)
        except OSError:
            pass  # ended between the listing and the read
    return ticks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--compare", metavar="CHECKOUT", help="another checkout to measure print(1) against")
    parser.add_argument("--scaling", action="store_true", help="also measure the scaling tables (minutes)")
    parser.add_argument("--only-compare", action="store_true", help="with --compare: only the compared cases")
    parser.add_argument("--compare-workers", type=int, default=2, help="with --compare: workers of each pool")
    parser.add_argument("--compare-config", metavar="FILE",
                        help="with --compare: a pynox.toml for this checkout's pool")
    parser.add_argument("--compare-all", action="store_true",
                        help="with --compare: also the pandas job, a session step and each idle pool's memory")
    args = parser.parse_args()
    runs, results = args.runs, {}
    if args.compare:
        results.update(compare(args.compare, runs, args.compare_workers, args.compare_config))
        if args.compare_all:
            results.update(compare_rest(args.compare, runs, args.compare_workers))
        if args.only_compare:
            results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                  "load_average_after": [round(load, 2) for load in os.getloadavg()]}
            report(results, args.json)
            return 0

    plain = PoolDriver("--workers=2")
    results["pool print(1), back to back"] = summary(timed(lambda: check_ok(plain.request({"code": "print(1)"})), runs))
    # An agent thinks between calls: the template has confined the next child by then.
    results["pool print(1), 20 ms apart"] = summary(timed(
        lambda: check_ok(plain.request({"code": "print(1)"})), runs, pause=0.02))
    results["subprocess python -c print(1)"] = summary(timed(
        lambda: subprocess.run([sys.executable, "-c", "print(1)"], check=True, capture_output=True), runs // 3))
    results["pool host call round trip"] = summary(timed(lambda: check_ok(plain.request(
        {"code": "from pynox_host import f\nf(1)", "functions": ["f"]}, on_call=lambda call: call["args"][0])),
        runs))
    four = ("import threading\nfrom pynox_host import f\n"
            "ts = [threading.Thread(target=f, args=(i,)) for i in range(4)]\n[t.start() for t in ts]\n"
            "[t.join() for t in ts]")
    results["pool host calls from 4 threads at once"] = summary(timed(lambda: check_ok(plain.request(
        {"code": four, "functions": ["f"]}, on_call=lambda call: call["args"][0])), runs))
    plain.request({"session": "bench", "code": "x = 0", "open": True})
    results["pool session step"] = summary(timed(
        lambda: check_ok(plain.request({"session": "bench", "code": "x += 1"})), runs))
    plain.request({"session": "bench", "close": True})
    # A template starts in ~150 ms; one waits ahead for the next session. New sessions faster than that
    # (a burst, back to back) wait for template starts; half a second apart, each finds one ready.
    results["pool first step of a new session, 0.5 s apart"] = summary(first_steps(plain, max(runs // 10, 20),
                                                                                  pause=0.5))
    results["pool first step of a new session, back to back"] = summary(first_steps(plain, max(runs // 10, 20)))
    results["pool print(1) job, private memory"] = job_private_memory(plain, max(runs // 20, 10))
    count = max(runs * 3, 1000)
    elapsed = plain.batch("pass", count)
    results["pool throughput, 2 workers"] = {"jobs_per_s": round(count / elapsed), "jobs": count}
    plain.close()

    single = PoolDriver("--workers=1")
    results["pool cancel to the next job's result, 1 worker"] = summary(
        [single.cancel_then_next() * 1000 for _ in range(max(runs // 5, 20))])
    results["pool trivial job alone, 1 worker"] = summary(timed(
        lambda: check_ok(single.request({"code": "pass"})), max(runs // 5, 20), pause=0.05))
    single.close()

    try:
        import pandas  # noqa: F401  - only to know whether the pandas cases can run
    except ImportError:
        print("pandas not installed: skipping the pandas cases", file=sys.stderr)
    else:
        warm = PoolDriver("--workers=2", "--preload=pandas")
        results["pool pandas op (preloaded), 20 ms apart"] = summary(timed(
            lambda: check_ok(warm.request({"code": PANDAS_CODE})), runs, pause=0.02))
        warm.close()
        results["cold python -c 'import pandas; ...'"] = summary(timed(
            lambda: subprocess.run([sys.executable, "-c", PANDAS_CODE], check=True, capture_output=True),
            max(runs // 20, 10), warmup=1))

    results.update(in_process_baselines(runs))
    results.update(sandlock_baseline(max(runs // 5, 20)))
    if args.scaling:
        results.update(scaling(runs))
    results["ratios"] = ratios(results)
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                          "load_average_after": [round(load, 2) for load in os.getloadavg()]}

    print(f"{'case':<{max(map(len, results))}}  figures   (cpus: {os.cpu_count()}, python {sys.version.split()[0]})")
    report(results, args.json)
    return 0


def report(results: dict[str, Any], json_path: str | None) -> None:
    """One line per case with its figures; with ``json_path``, every figure written there too (the benches share
    this)."""
    width = max(map(len, results))
    for name, figures in results.items():
        print(f"{name:<{width}}  " + "  ".join(f"{k}={v}" for k, v in figures.items()))
    if json_path:
        save_json(results, json_path)


def save_json(results: dict[str, Any], path: str) -> None:
    with open(path, "w") as out:
        json.dump(results, out, indent=2)


def in_process_baselines(runs: int) -> dict[str, dict[str, float]]:
    """What a framework user would compare the pool with: code run in this very process, unconfined."""
    results: dict[str, dict[str, float]] = {}
    try:
        from smolagents.local_python_executor import LocalPythonExecutor
    except ImportError:
        print("smolagents not installed: skipping its baseline", file=sys.stderr)
    else:
        local = LocalPythonExecutor(additional_authorized_imports=["pandas"])
        local.send_tools({})
        results["smolagents LocalPythonExecutor print(1)"] = summary(timed(lambda: local("print(1)"), runs))
        try:
            import pandas  # noqa: F401
        except ImportError:
            pass
        else:
            results["smolagents LocalPythonExecutor pandas op"] = summary(timed(lambda: local(PANDAS_CODE), runs))
    try:
        import pydantic_monty
    except ImportError:
        print("pydantic-monty not installed: skipping its baseline", file=sys.stderr)
    else:
        with pydantic_monty.Monty() as monty, monty.checkout(script_name="bench.py") as session:
            results["pydantic-monty print(1)"] = summary(timed(
                lambda: session.feed_run("print(1)", print_callback=lambda *_: None), runs))
    return results


def first_steps(pool: PoolDriver, runs: int, pause: float = 0.0) -> list[float]:
    """Milliseconds to the first step's result of a new session (the session is closed after, untimed), new
    sessions ``pause`` seconds apart."""
    samples = []
    for index in range(runs):
        time.sleep(pause)
        start = time.perf_counter()
        check_ok(pool.request({"session": f"new{index}", "code": "x = 1", "open": True}))
        samples.append((time.perf_counter() - start) * 1000)
        pool.request({"session": f"new{index}", "close": True})
    return samples


def job_private_memory(pool: PoolDriver, runs: int) -> dict[str, float]:
    """Private memory (MB) of a job's process once it has printed: what it copied of its template's pages
    or allocated, read from the host (smaps_rollup) while the job sleeps after its ``print(1)``."""
    sizes = []
    for _ in range(runs):
        pool.ids += 1
        pool.send(json.dumps({"id": pool.ids, "code": "print(1)\nimport time\ntime.sleep(0.3)"}).encode() + b"\n")
        time.sleep(0.15)
        jobs = [pid for pid in descendants(pool.proc.pid) if process_name(pid) == "pynox-job"]
        for pid in jobs:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as rollup:
                    fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup if line.endswith("kB\n")}
                sizes.append((fields["Private_Clean"] + fields["Private_Dirty"]) / 1024)
            except OSError:
                pass
        while json.loads(pool.stdout.readline()).get("id") != pool.ids:
            pass
    ordered = sorted(sizes)
    return {"p50_mb": round(statistics.median(ordered), 2), "max_mb": round(ordered[-1], 2), "runs": len(ordered)}


def sandlock_baseline(runs: int) -> dict[str, dict[str, float]]:
    """sandlock running ``python -c print(1)``: a process per call, confined with Landlock and seccomp. A control
    first shows its confinement holds (writing outside its grants fails), so the figure is of a real sandbox."""
    try:
        import sandlock
    except ImportError:
        print("sandlock not installed (pip install -r bench/requirements.txt): skipping its baseline",
              file=sys.stderr)
        return {}
    import sysconfig
    readable = sorted({os.path.realpath(path) for path in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"],
                                                           "/usr", "/lib", "/lib64", "/etc", "/proc", "/dev")})
    sandbox = sandlock.Sandbox(fs_readable=readable)
    denied = sandbox.run([sys.executable, "-c", "open('/root/.pynox-bench-probe', 'w')"], timeout=30)
    assert not denied.success and not os.path.exists("/root/.pynox-bench-probe"), "sandlock did not confine"
    return {"sandlock python -c print(1)": summary(timed(
        lambda: check_ok({"exit": 0 if sandbox.run([sys.executable, "-c", "print(1)"], timeout=30).success else 1}),
        runs))}


def descendants(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        try:
            kids = children_of(current)
        except OSError:
            continue
        found += kids
        pending += kids
    return found


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


# Each baseline beside the pool case it is compared with: the ratio is baseline p50 / pool p50.
RATIO_PAIRS = {
    "subprocess python -c print(1)": "pool print(1), 20 ms apart",
    "sandlock python -c print(1)": "pool print(1), 20 ms apart",
    "cold python -c 'import pandas; ...'": "pool pandas op (preloaded), 20 ms apart",
    "smolagents LocalPythonExecutor print(1)": "pool print(1), 20 ms apart",
    "smolagents LocalPythonExecutor pandas op": "pool pandas op (preloaded), 20 ms apart",
    "pydantic-monty print(1)": "pool print(1), 20 ms apart",
}


def ratios(results: dict[str, Any]) -> dict[str, float]:
    return {f"{baseline} / {pool}": round(results[baseline]["p50_ms"] / results[pool]["p50_ms"], 3)
            for baseline, pool in RATIO_PAIRS.items() if baseline in results and pool in results}


def scaling(runs: int) -> dict[str, dict[str, float]]:
    """The scaling tables of docs/performance.md."""
    results: dict[str, dict[str, float]] = {}
    for workers in (1, 2, 4, 8):
        pool = PoolDriver(f"--workers={workers}")
        latency = summary(timed(lambda pool=pool: check_ok(pool.request({"code": "print(1)"})), runs // 2,
                                pause=0.02))
        count = max(runs * 2, 600)
        results[f"scaling {workers} workers"] = {**latency, "jobs_per_s": round(count / pool.batch("pass", count)),
                                                 "server_and_templates_rss_mb": tree_rss_mb(pool.proc.pid)}
        pool.close()
    for sessions in (1, 10, 100):
        pool = PoolDriver("--workers=2", f"--max-sessions={max(sessions, 16)}")
        names = [f"s{index}" for index in range(sessions)]
        for name in names:
            check_ok(pool.request({"session": name, "code": "x = 0"}))
        steps = max(runs, 200)
        start = time.perf_counter()
        for step in range(steps):
            check_ok(pool.request({"session": names[step % sessions], "code": "x += 1"}))
        elapsed = time.perf_counter() - start
        total = tree_rss_mb(pool.proc.pid)
        results[f"scaling {sessions} sessions"] = {"steps_per_s": round(steps / elapsed), "total_rss_mb": total,
                                                    "per_session_mb": round(total / sessions, 2)}
        pool.close()
    pool = PoolDriver("--workers=1")
    # Decimal sizes: a request line is capped at 1 MiB, and so is a job's output by default.
    for label, size in (("1 KB", 1_000), ("100 KB", 100_000), ("1 MB", 1_000_000)):
        padding = "#" * (size - 40)  # a comment: code of this size that still runs in no time
        results[f"scaling code {label}"] = summary(timed(
            lambda code=f"print(1)\n{padding}": check_ok(pool.request({"code": code})), max(runs // 4, 30)))
        results[f"scaling output {label}"] = summary(timed(
            lambda code=f"print('x' * {size})": check_ok(pool.request({"code": code})), max(runs // 4, 30)))
    pool.close()
    return results


def children_of(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (a worker thread, not the main one, starts the template)."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                children += [int(child) for child in listing.read().split()]
        except OSError:
            pass
    return children


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (proportional set size, so shared pages count once)."""
    total_kb = 0
    for current in [pid, *descendants(pid)]:
        try:
            with open(f"/proc/{current}/smaps_rollup") as rollup:
                total_kb += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return round(total_kb / 1024, 1)


if __name__ == "__main__":
    sys.exit(main())
