"""The floor of this design, measured in the same run as the pool: a confined job from a warm template at the least.

The floor is a warm interpreter (the template's modules imported, the runtime prepared by the product's own
``prepare_runtime``) that forks a child ahead of each job. The child confines itself with the product's own
setup steps (``job/native_setup.confine_steps``: the one native call where the extension loads, else the
Python steps, exactly as a pool's child would) under the confinement the pool's own code gives the request
(``server/jobs.to_job``), so the floor confines exactly what the product confines: every rule, grant, limit
and filter. It then sends its seccomp listener to the parent (which closes it: the job makes no delegated
call), waits on its control socket for the code and its two output pipes, runs the code, writes a report of
about 100 bytes and exits. The driver talks to it as to the pool: a JSON line in, a JSON line out, over
pipes. Left out of the floor, so it is a floor: the server (its request parsing, grants opened per job,
scheduling, the result), the payload and its claim, the steward, cgroups, the result's figures.

Each round runs the job on the pool (one worker) and on the floor, alternately, 10 ms apart and back to
back; the CPU per job of each (all their processes, from /proc, over interleaved blocks of 50 jobs) is
reported beside its ratio to the floor's. ``--job print`` is ``print(1)``; ``--job pandas`` is latency.py's
small pandas operation, with pandas preloaded in both (the pool's ``--preload=pandas``, the floor's parent
importing it before its first fork).

    python bench/floor_job.py [--runs 400] [--job print|pandas] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from host_calls import cpu_ticks, emit, pool_cpu  # type: ignore[import-not-found]  # run from bench/
from latency import PANDAS_CODE, PoolDriver, check_ok, summary  # type: ignore[import-not-found]

HERE = os.path.dirname(os.path.abspath(__file__))
_TICK = os.sysconf("SC_CLK_TCK")
_REPORT = json.dumps({"exit": 0, "error": None, "setup_error": None, "return_value": None,
                      "images": [], "padding": "x" * 20}).encode()


JOBS = {"print": ("print(1)", "1\n"), "pandas": (PANDAS_CODE, "4950\n")}


def serve(preload: list[str]) -> None:
    """The floor's warm parent: a JSON line with ``code`` in, its stdout as a JSON line out."""
    import importlib
    import socket

    for module in preload:
        importlib.import_module(module)
    import pynox.template.fork_server  # noqa: F401  - what a template holds, so that the floor forks as large a process
    from pynox.job.native_setup import confine_steps
    from pynox.job.setup import Setup, run_steps
    from pynox.policy import native_call, prepare_runtime, reset_environment
    from pynox.protocol import Request
    from pynox.server.jobs import to_job
    from pynox.wire.descriptors import CONTROL

    runtime = prepare_runtime((), ())
    reset_environment()
    # The confinement the pool gives this request, from the pool's own code: the floor confines exactly it.
    spec, _ = to_job(Request(code="print(1)"), cwd=os.getcwd(), runtime_paths=runtime.read_paths)
    confinement = spec.confinement
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def fork_ahead() -> tuple[int, socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # As the template does: the native call laid out before the fork.
        call = (native_call(confinement, runtime, [], [theirs.fileno()], (CONTROL,), prepared=True)
                if runtime.native is not None else None)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                setup = Setup(confinement, runtime, [], [theirs.detach()], (CONTROL,), prepared=True, native_call=call)
                if run_steps(setup, confine_steps(setup)) is not None:
                    os._exit(125)
                with socket.socket(fileno=CONTROL) as control:
                    code, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
                out, report = fds
                os.dup2(out, 1)
                exec(compile(code, "agent.py", "exec"), {"__name__": "__main__"})
                sys.stdout.flush()
                os.write(report, _REPORT)
            finally:
                os._exit(0)
        theirs.close()
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        for fd in fds:
            os.close(fd)  # the listener: the pool would hold it; print(1) makes no delegated call
        return pid, ours

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
        pid, control = child
        out_r, out_w = os.pipe()
        report_r, report_w = os.pipe()
        socket.send_fds(control, [request["code"].encode()], [out_w, report_w])
        control.close()
        os.close(out_w)
        os.close(report_w)
        printed = drain(out_r)
        report = drain(report_r)
        os.waitpid(pid, 0)
        stdout.write(json.dumps({"id": request["id"], "exit": 0 if report else 1,
                                 "stdout": printed.decode()}).encode() + b"\n")
        stdout.flush()
        child = fork_ahead()  # after the answer, as the template prepares its next child


class FloorDriver(PoolDriver):  # type: ignore[misc]  # latency.py is not type-checked from here
    """The floor, driven exactly as the pool is (PoolDriver's request and close)."""

    def __init__(self, preload: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve",
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
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--preload", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.preload)
        return 0
    preload = ["pandas"] if args.job == "pandas" else []
    drivers: dict[str, PoolDriver] = {"pool": PoolDriver("--workers=1", *(f"--preload={m}" for m in preload)),
                                      "floor": FloorDriver(preload)}
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
