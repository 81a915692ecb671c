"""The soak's work: a seeded random mix of requests, each with the one outcome the pool must give it.

Every kind names the request fields, how the client answers its host calls,
and what its result must say: the stats class it counts under (``ok``,
``failed``, ``timeouts``, ``signals``, ``setup_errors``, ``request_errors``),
the exit status, the error type, and where it is deterministic, the output.
A session scenario is a list of steps driven one after the other, with
crashes between them, ending in ``close``.

The expected outcome is fixed when the plan is drawn, never read back from a
result: the counters the pool reports are compared with what was planned.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# The tight limits that make a misbehaving job end quickly, the same in every profile.
KILL_AFTER = "250ms"  # the timeout of jobs that never finish on their own
SMALL_MEMORY = "96m"  # the runtime needs about 30 MiB; the bombs hit the rest
CAPPED_OUTPUT = 4096
FILE_CAP = "16k"
FILES = "files"  # the directory granted to file-size jobs, under the pool's working directory


@dataclass(frozen=True)
class Expect:
    outcome: str  # the stats counter the result falls under
    exit: int
    error: str | None = None
    stdout: str | None = None  # exact, when the kind makes it deterministic
    message: str | None = None  # a substring of the error message
    truncated: bool = False
    session_ended: bool | None = None  # session steps only
    step: int | None = None  # session steps only


@dataclass(frozen=True)
class Host:
    """How the client answers one function: at once, with an error, after a delay, or only after the job ended."""

    mode: str  # "value" | "error" | "slow" | "late"
    delay: float = 0.0


@dataclass
class Job:
    kind: str
    fields: dict[str, Any]
    expect: Expect
    host: dict[str, Host] = field(default_factory=dict)
    calls: int = 0  # host calls the code makes when nothing kills it first


@dataclass
class Scenario:
    """One session: steps sent one at a time, each after the previous step's result, then close."""

    name: str
    steps: list[Job]


def _host_value(function: str, args: list[Any]) -> Any:
    if function == "echo":
        return args[0]
    if function == "slow":
        return args[0] + 1
    raise AssertionError(f"no value for {function}")


def host_reply(function: str, args: list[Any], host: Host) -> dict[str, Any]:
    """The reply body the client sends for a call."""
    if host.mode == "error":
        return {"error": f"host says no: {args[0]}"}
    if host.mode == "late":
        return {"result": "too late"}
    return {"result": _host_value(function, args)}


def _ok(rng: random.Random, n: int) -> Job:
    return Job("ok", {"code": f"print({n} * 3)"}, Expect("ok", 0, stdout=f"{n * 3}\n"))


def _raise(rng: random.Random, n: int) -> Job:
    return Job("raise", {"code": f"raise ValueError('soak {n}')"},
               Expect("failed", 1, "ValueError", message=f"soak {n}"))


def _exit3(rng: random.Random, n: int) -> Job:
    return Job("exit3", {"code": "import sys\nsys.exit(3)"}, Expect("failed", 3))


def _timeout(rng: random.Random, n: int) -> Job:
    code = rng.choice(["while True:\n    pass", "import time\ntime.sleep(60)"])
    return Job("timeout", {"code": code, "timeout": KILL_AFTER}, Expect("timeouts", 124, "TimeoutError"))


def _memory(rng: random.Random, n: int) -> Job:
    code = rng.choice(["x = bytearray(1 << 34)", "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 20))"])
    return Job("memory_bomb", {"code": code, "memory": SMALL_MEMORY}, Expect("failed", 1, "MemoryError"))


def _flood(rng: random.Random, n: int) -> Job:
    code = ("import sys\nchunk = 'y' * 65536\nfor _ in range(32):\n"
            "    sys.stdout.write(chunk)\n    sys.stderr.write(chunk)")
    return Job("output_flood", {"code": code, "max_output": CAPPED_OUTPUT},
               Expect("ok", 0, stdout="y" * CAPPED_OUTPUT, truncated=True))


def _file_size(rng: random.Random, n: int) -> Job:
    code = f"with open('{FILES}/f{n % 8}', 'wb') as out:\n    out.write(b'z' * 65536)"
    return Job("file_size", {"code": code, "allow_write": [FILES], "max_file_size": FILE_CAP},
               Expect("failed", 1, "OSError", message="File too large"))


def _denied_path(rng: random.Random, n: int) -> Job:
    code = rng.choice(["open('/etc/shadow').read()", "import os\nos.listdir('/root')", "open('escape.txt', 'w')"])
    return Job("denied_path", {"code": code}, Expect("failed", 1, "PermissionError", message="Permission denied"))


def _denied_subprocess(rng: random.Random, n: int) -> Job:
    code = rng.choice(["import subprocess\nsubprocess.run(['/bin/true'])", "import os\nos.fork()",
                       "import os\nos.execv('/bin/true', ['true'])"])
    return Job("denied_subprocess", {"code": code},
               Expect("failed", 1, "PermissionError", message="Operation not permitted"))


def _denied_socket(rng: random.Random, n: int) -> Job:
    code = rng.choice(["import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=5)",
                       "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 9))",
                       "import socket\nsocket.socket(socket.AF_UNIX).connect('/run/pynox-soak.sock')"])
    return Job("denied_socket", {"code": code},
               Expect("failed", 1, "PermissionError", message="Operation not permitted"))


def _native_crash(rng: random.Random, n: int) -> Job:
    return Job("native_crash", {"code": "import ctypes\nctypes.string_at(0)"},
               Expect("signals", 128 + 11, "SignalError", message="SIGSEGV"))


def _abort(rng: random.Random, n: int) -> Job:
    return Job("abort", {"code": "import os\nos.abort()"}, Expect("signals", 128 + 6, "SignalError", message="SIGABRT"))


def _thread_bomb(rng: random.Random, n: int) -> Job:
    code = ("import threading\nstop = threading.Event()\nwhile True:\n"
            "    threading.Thread(target=stop.wait, daemon=True).start()")
    return Job("thread_bomb", {"code": code}, Expect("failed", 1, "RuntimeError", message="can't start new thread"))


def _host_calls(rng: random.Random, n: int) -> Job:
    code = (f"from pynox_host import HostError, echo, fail, slow\nprint(echo({n}))\n"
            f"try:\n    fail('{n}')\nexcept HostError as exc:\n    print('caught', exc)\nprint(slow({n}))")
    host = {"echo": Host("value"), "fail": Host("error"), "slow": Host("slow", rng.uniform(0.01, 0.1))}
    return Job("host_calls", {"code": code, "functions": list(host)},
               Expect("ok", 0, stdout=f"{n}\ncaught host says no: {n}\n{n + 1}\n"), host, calls=3)


def _host_error(rng: random.Random, n: int) -> Job:
    return Job("host_error", {"code": f"from pynox_host import fail\nfail('{n}')", "functions": ["fail"]},
               Expect("failed", 1, "HostError", message=f"host says no: {n}"), {"fail": Host("error")}, calls=1)


def _host_late(rng: random.Random, n: int) -> Job:
    # The client answers only after the job's result: the reply must be refused (id null), not delivered.
    return Job("host_late", {"code": "from pynox_host import never\nnever()", "functions": ["never"],
                             "timeout": KILL_AFTER},
               Expect("timeouts", 124, "TimeoutError"), {"never": Host("late")}, calls=1)


def _refused(rng: random.Random, n: int) -> Job:
    fields = rng.choice([{"code": "print(1)", "timout": "5s"}, {"code": "print(1)", "script": "x.py"},
                         {"code": "print(1)", "memory": "lots"}, {"script": "missing.py"}])
    return Job("refused", fields, Expect("request_errors", 2, "RequestError"))


def _setup_error(rng: random.Random, n: int) -> Job:
    # A memory limit below what the runtime already uses: the policy cannot be applied, the code never runs.
    return Job("setup_error", {"code": "print('never')", "memory": 4096},
               Expect("setup_errors", 125, "SandboxSetupError", message="memory limit"))


_CRASHES = [
    ("import ctypes\nctypes.string_at(0)", {}, Expect("signals", 128 + 11, "SignalError", message="SIGSEGV")),
    ("import os\nos.abort()", {}, Expect("signals", 128 + 6, "SignalError", message="SIGABRT")),
    ("import sys\nsys.exit(3)", {}, Expect("failed", 3)),
    ("while True:\n    pass", {"timeout": KILL_AFTER}, Expect("timeouts", 124, "TimeoutError")),
]


def _scenario(rng: random.Random, n: int) -> Scenario:
    """Define, use, raise (the session survives), crash (it ends), then a fresh process under the same name."""
    name = f"soak-session-{n}"
    with_host = rng.random() < 0.5
    first: dict[str, Any] = {"session": name, "code": f"x = {n}", "open": True}
    if with_host:
        first["functions"] = ["echo"]
    use = "from pynox_host import echo\nprint(echo(x))" if with_host else "print(x)"
    crash, extra, crashed = rng.choice(_CRASHES)
    steps = [
        Job("session_step", first, Expect("ok", 0, stdout="", session_ended=False, step=1)),
        Job("session_step", {"session": name, "code": use},
            Expect("ok", 0, stdout=f"{n}\n", session_ended=False, step=2),
            {"echo": Host("value")} if with_host else {}, calls=1 if with_host else 0),
        Job("session_step", {"session": name, "code": "raise KeyError('kept')"},
            Expect("failed", 1, "KeyError", session_ended=False, step=3)),
        Job("session_crash", {"session": name, "code": crash, **extra},
            Expect(**{**crashed.__dict__, "session_ended": True, "step": 4})),
        # A new process, opened again (a step alone is refused): the variable is gone, and it is step 1 again.
        Job("session_step", {"session": name, "code": "print(x)", "open": True},
            Expect("failed", 1, "NameError", session_ended=False, step=1)),
        Job("session_close", {"session": name, "close": True}, Expect("closed", 0)),
    ]
    return Scenario(name, steps)


# kind -> (weight, factory). Session scenarios are drawn like jobs, and each yields five results.
KINDS = {
    "ok": (20, _ok),
    "raise": (5, _raise),
    "exit3": (5, _exit3),
    "timeout": (2, _timeout),
    "memory_bomb": (4, _memory),
    "output_flood": (4, _flood),
    "file_size": (4, _file_size),
    "denied_path": (4, _denied_path),
    "denied_subprocess": (4, _denied_subprocess),
    "denied_socket": (4, _denied_socket),
    "native_crash": (4, _native_crash),
    "abort": (4, _abort),
    "thread_bomb": (2, _thread_bomb),
    "host_calls": (6, _host_calls),
    "host_error": (3, _host_error),
    "host_late": (1, _host_late),
    "refused": (2, _refused),
    "setup_error": (1, _setup_error),
}
SCENARIO_WEIGHT = 2
RESULTS_PER_SCENARIO = 5


@dataclass
class Plan:
    jobs: list[Job]
    scenarios: list[Scenario]

    @property
    def results(self) -> int:
        return len(self.jobs) + RESULTS_PER_SCENARIO * len(self.scenarios)

    def kinds(self) -> Counter[str]:
        counts = Counter(job.kind for job in self.jobs)
        counts["session_scenario"] = len(self.scenarios)
        return counts


def draw(seed: int, results: int, prefix: str) -> Plan:
    """A plan of about ``results`` results (jobs plus session steps), the same for the same seed."""
    rng = random.Random(seed)
    names = [*KINDS, "session"]
    weights = [KINDS[k][0] for k in KINDS] + [SCENARIO_WEIGHT]
    plan = Plan([], [])
    n = 0
    while plan.results < results:
        n += 1
        kind = rng.choices(names, weights)[0]
        if kind == "session":
            plan.scenarios.append(_scenario(rng, n))
            _number_steps(plan.scenarios[-1], prefix, n)
        else:
            job = KINDS[kind][1](rng, n)
            job.fields["id"] = f"{prefix}-{n}"
            plan.jobs.append(job)
    return plan


def _number_steps(scenario: Scenario, prefix: str, n: int) -> None:
    for index, step in enumerate(scenario.steps):
        step.fields["id"] = f"{prefix}-{n}.{index}"
