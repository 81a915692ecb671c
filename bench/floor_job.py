"""The floor of this design, measured in the same run as the pool: a confined job from a warm template at the least.

The floor is a warm interpreter (the template's modules imported, the runtime prepared by the product's own
``prepare_runtime``, a Landlock ruleset built once from the runtime's rules) that forks a child ahead of each
job. The child confines itself in one native call (``floor_confine.c``: rlimits, the parent-death signal,
no_new_privs, Landlock, the product's own main seccomp program and its listener), waits on a pipe for the
code, runs it, writes a report of about 100 bytes and exits. The driver talks to it as to the pool: a JSON
line in, a JSON line out, over pipes. Left out of the floor, so it is a floor: the job's grants and its
``/proc/<pid>`` rules, the second seccomp filter, the steward, cgroups, the result's figures.

Each round runs the job on the pool (one worker) and on the floor, alternately, 10 ms apart and back to
back; the CPU per job of each (all their processes, from /proc, over interleaved blocks of 50 jobs) is
reported beside its ratio to the floor's. ``--job print`` is ``print(1)``; ``--job pandas`` is latency.py's
small pandas operation, with pandas preloaded in both (the pool's ``--preload=pandas``, the floor's parent
importing it before its first fork). The shared library is built at the first run with the machine's C
compiler (``$CC``, else ``cc``); without one the bench says so and stops.

    python bench/floor_job.py [--runs 400] [--job print|pandas] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from host_calls import cpu_ticks, emit, pool_cpu  # type: ignore[import-not-found]  # run from bench/
from latency import PANDAS_CODE, PoolDriver, check_ok, summary  # type: ignore[import-not-found]

HERE = os.path.dirname(os.path.abspath(__file__))
_TICK = os.sysconf("SC_CLK_TCK")
_REPORT = json.dumps({"exit": 0, "error": None, "setup_error": None, "return_value": None,
                      "images": [], "padding": "x" * 20}).encode()


def build_library() -> str:
    """Compile floor_confine.c into a shared library in a temporary directory; its path."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("floor_job.py: no C compiler (set $CC, or install cc): the floor confines natively")
    out = os.path.join(tempfile.mkdtemp(prefix="pynox-floor-"), "floor_confine.so")
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", out, os.path.join(HERE, "floor_confine.c")],
                   check=True)
    return out


JOBS = {"print": ("print(1)", "1\n"), "pandas": (PANDAS_CODE, "4950\n")}


def serve(library: str, preload: list[str]) -> None:
    """The floor's warm parent: a JSON line with ``code`` in, its stdout as a JSON line out."""
    import importlib

    for module in preload:
        importlib.import_module(module)
    import pynox.job.child  # what a template holds, so that the floor forks as large a process
    import pynox.template.fork_server  # noqa: F401
    from pynox.policy import landlock, prepare_runtime, reset_environment

    runtime = prepare_runtime((), ())
    reset_environment()
    ruleset = landlock.build_ruleset(runtime.landlock_abi, network=False, prepared=runtime.rules.current())
    program = runtime.filters["none"]._address  # the product's own program, laid out once (LoadableFilter)
    confine = ctypes.CDLL(library).floor_confine
    confine.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                        ctypes.c_long]
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def fork_ahead() -> tuple[int, int, int, int]:
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (job_w, out_r, report_r):
                    os.close(fd)
                listener = confine(ruleset, program, 1 << 30, 30, 1 << 30, 256)
                if listener < 0:
                    os._exit(125)
                os.close(listener)  # the pool would hold it; print(1) makes no delegated call
                code = os.read(job_r, 1 << 16)
                os.dup2(out_w, 1)
                exec(compile(code, "agent.py", "exec"), {"__name__": "__main__"})
                sys.stdout.flush()
                os.write(report_w, _REPORT)
            finally:
                os._exit(0)
        for fd in (job_r, out_w, report_w):
            os.close(fd)
        return pid, job_w, out_r, report_r

    def drain(fd: int) -> bytes:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        os.close(fd)
        return b"".join(chunks)

    stdout.write(b'{"event": "ready"}\n')
    stdout.flush()
    child = fork_ahead()
    for line in stdin:
        request = json.loads(line)
        pid, job_w, out_r, report_r = child
        os.write(job_w, request["code"].encode())
        os.close(job_w)
        printed = drain(out_r)
        report = drain(report_r)
        os.waitpid(pid, 0)
        stdout.write(json.dumps({"id": request["id"], "exit": 0 if report else 1,
                                 "stdout": printed.decode()}).encode() + b"\n")
        stdout.flush()
        child = fork_ahead()  # after the answer, as the template prepares its next child


class FloorDriver(PoolDriver):  # type: ignore[misc]  # latency.py is not type-checked from here
    """The floor, driven exactly as the pool is (PoolDriver's request and close)."""

    def __init__(self, library: str, preload: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", library,
                                      *(f"--preload={module}" for module in preload)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=HERE)
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        ready = json.loads(self.stdout.readline())
        assert ready["event"] == "ready", ready
        self.ids = 0


def _job(driver: PoolDriver, job: str) -> float:
    code, printed = JOBS[job]
    start = time.perf_counter()
    reply = driver.request({"code": code})
    took = (time.perf_counter() - start) * 1000
    check_ok(reply)
    assert reply["stdout"] == printed, reply
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--job", choices=sorted(JOBS), default="print")
    parser.add_argument("--json")
    parser.add_argument("--serve", metavar="LIBRARY", help=argparse.SUPPRESS)
    parser.add_argument("--preload", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.preload)
        return 0
    preload = ["pandas"] if args.job == "pandas" else []
    drivers: dict[str, PoolDriver] = {"pool": PoolDriver("--workers=1", *(f"--preload={m}" for m in preload)),
                                      "floor": FloorDriver(build_library(), preload)}
    cpu_of = {"pool": pool_cpu, "floor": cpu_ticks}
    load_before = os.getloadavg()
    latency: dict[str, dict[str, list[float]]] = {mode: {name: [] for name in drivers}
                                                  for mode in ("10 ms apart", "back to back")}
    for driver in drivers.values():
        for _ in range(20):
            _job(driver, args.job)
    for _ in range(args.runs):
        for name, driver in drivers.items():
            time.sleep(0.01)
            latency["10 ms apart"][name].append(_job(driver, args.job))
            latency["back to back"][name].append(_job(driver, args.job))
    cpu: dict[str, list[float]] = {name: [] for name in drivers}
    for _ in range(max(args.runs // 50, 3)):
        for name, driver in drivers.items():
            before = cpu_of[name](driver.proc.pid)
            for _ in range(50):
                _job(driver, args.job)
            cpu[name].append((cpu_of[name](driver.proc.pid) - before) * 1000 / _TICK / 50)
    for driver in drivers.values():
        driver.close()
    label = JOBS[args.job][0] if args.job == "print" else "pandas op (preloaded)"
    results: dict[str, Any] = {"python": sys.version.split()[0], "job": label, "load before": load_before,
                               "load after": os.getloadavg()}
    for mode, samples in latency.items():
        figures = {name: summary(values) for name, values in samples.items()}
        figures["pool / floor, p50"] = round(figures["pool"]["p50_ms"] / figures["floor"]["p50_ms"], 2)
        results[f"{label} latency, {mode}"] = figures
    per_job = {name: round(statistics.median(values), 2) for name, values in cpu.items()}
    results[f"{label} CPU ms per job, all processes"] = {
        **per_job, "pool / floor": round(per_job["pool"] / per_job["floor"], 2) if per_job["floor"] else None}
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
