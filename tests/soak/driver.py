"""The soak driver: keeps a real pool saturated with a planned mix and checks every line it answers.

One thread does everything, so the order of events is the order they are
handled: it keeps ``3 x workers`` plain jobs in flight (two run, the pool's
queue of ``2 x workers`` stays full: requests arrive faster than they finish,
and intake is never blocked, so host replies always get through), drives a few
session scenarios step by step beside them, answers host calls (at once, with
an error, after a delay, or only after the job's result, which the pool must
then refuse), and checks each result against its plan the moment it arrives.

Also here: what an idle pool looks like from outside (RSS, descriptors by
kind, threads, processes below it), so the soak can compare two idle moments.
"""

from __future__ import annotations

import heapq
import itertools
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.harness import procfs
from tests.pool.pool_driver import (
    PREPARED_PER_WORKER,
    ZYGOTE,
    PoolProcess,
    pool_depths,
    prepared_for_a_session,
    proc_table,
    rss_kb,
)

from .mix import Expect, Job, Plan, Scenario, host_reply

STALL = 60.0  # seconds without any line from the pool while work is in flight: the soak fails
SESSIONS_AT_ONCE = 3
_LATE_REFUSAL = re.compile(r"^reply to call (\d+): no such call is pending")


@dataclass
class Tally:
    """What the plan says the pool's counters must show, and what the soak saw."""

    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    results: int = 0
    host_calls: int = 0
    late_replies: int = 0
    problems: list[str] = field(default_factory=list)
    queue_us: list[int] = field(default_factory=list)

    def expect(self, expect: Expect) -> None:
        if expect.outcome == "closed":
            return  # a close answer is not a result and no counter counts it
        self.outcomes[expect.outcome] += 1
        if expect.error is not None:
            self.errors[expect.error] += 1


@dataclass
class _Flight:
    job: Job
    scenario: Scenario | None = None
    index: int = 0
    calls: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)


class Driver:
    def __init__(self, pool: PoolProcess, workers: int, tally: Tally) -> None:
        self.pool = pool
        self.window = 3 * workers
        self.tally = tally
        self.cursor = pool.index_of(pool.ready) + 1  # next index in pool.messages to handle
        self.flights: dict[str, _Flight] = {}
        self.answers: Counter[str] = Counter()  # answers per id, to prove each id gets exactly one
        self.plain_in_flight = 0
        self.replies: list[tuple[float, int, dict[str, Any]]] = []
        self.late_pending: set[int] = set()  # late replies sent, whose refusal has not come yet
        self._order = itertools.count()

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self, plan: Plan) -> None:
        jobs = iter(plan.jobs)
        scenarios = iter(plan.scenarios)
        jobs_left = scenarios_left = True
        active_scenarios = 0
        last_line = time.monotonic()
        while True:
            while jobs_left and self.plain_in_flight < self.window:
                job = next(jobs, None)
                if job is None:
                    jobs_left = False
                    break
                self._submit(_Flight(job))
                self.plain_in_flight += 1
            while scenarios_left and active_scenarios < SESSIONS_AT_ONCE:
                scenario = next(scenarios, None)
                if scenario is None:
                    scenarios_left = False
                    break
                self._submit(_Flight(scenario.steps[0], scenario, 0))
                active_scenarios += 1
            self._send_due_replies()
            if not (jobs_left or scenarios_left or self.flights or self.replies or self.late_pending):
                return
            if self.cursor < len(self.pool.messages):
                message = self.pool.messages[self.cursor]
                self.cursor += 1
                last_line = time.monotonic()
                finished = self._handle(message)
                if finished == "plain":
                    self.plain_in_flight -= 1
                elif finished == "scenario":
                    active_scenarios -= 1
                continue
            if self.pool.proc.poll() is not None:
                raise AssertionError(f"the pool exited ({self.pool.proc.returncode}) during the soak; "
                                     f"stderr: {bytes(self.pool.stderr[-2000:])!r}")
            if time.monotonic() - last_line > STALL:
                raise AssertionError(f"no line from the pool for {STALL:.0f}s; in flight: "
                                     f"{sorted(self.flights)[:10]}, late replies unanswered: {self.late_pending}")
            time.sleep(0.0005)

    def _submit(self, flight: _Flight) -> None:
        request_id = flight.job.fields["id"]
        assert request_id not in self.flights and self.answers[request_id] == 0, f"the plan reuses {request_id}"
        self.flights[request_id] = flight
        self.tally.expect(flight.job.expect)
        self.pool.send(flight.job.fields)

    def _send_due_replies(self) -> None:
        now = time.monotonic()
        while self.replies and self.replies[0][0] <= now:
            _, _, reply = heapq.heappop(self.replies)
            self.pool.send({"reply": reply})

    # -- one line from the pool ---------------------------------------------------------------------------
    def _handle(self, message: dict[str, Any]) -> str | None:
        if message.get("event") == "call":
            self._call(message)
            return None
        request_id = message.get("id")
        if request_id is None:
            self._refused_reply(message)
            return None
        if not isinstance(request_id, str):
            self.tally.problems.append(f"an answer with an id the soak never sent: {message}")
            return None
        self.answers[request_id] += 1
        flight = self.flights.pop(request_id, None)
        if flight is None:
            self.tally.problems.append(f"a second answer, or one to an unknown id: {_brief(message)}")
            return None
        self._check(flight.job, message)
        # Every call the code makes reaches the client once; only a job killed by its deadline may make fewer.
        if len(flight.calls) != flight.job.calls and not (flight.job.expect.outcome == "timeouts"
                                                         and len(flight.calls) < flight.job.calls):
            self.tally.problems.append(f"{flight.job.kind} {request_id}: {len(flight.calls)} call events, "
                                       f"planned {flight.job.calls}")
        for call_id in flight.late:  # now that the job has ended, its pending call must be gone
            self.pool.send({"reply": {"call_id": call_id, **host_reply("never", [], flight.job.host["never"])}})
            self.late_pending.add(call_id)
            self.tally.late_replies += 1
        if flight.scenario is None:
            return "plain"
        following = flight.index + 1
        if following == len(flight.scenario.steps):
            return "scenario"
        self._submit(_Flight(flight.scenario.steps[following], flight.scenario, following))
        return None

    def _call(self, event: dict[str, Any]) -> None:
        flight = self.flights.get(event.get("id"))  # type: ignore[arg-type]
        function = event.get("function")
        host = flight.job.host.get(function) if flight is not None and isinstance(function, str) else None
        if flight is None or host is None or not isinstance(function, str):
            self.tally.problems.append(f"a call event for no job in flight or an undeclared name: {event}")
            return
        self.tally.host_calls += 1
        flight.calls.append(event["call_id"])
        reply = {"call_id": event["call_id"], **host_reply(function, event["args"], host)}
        if host.mode == "late":
            flight.late.append(event["call_id"])
        elif host.mode == "slow":
            heapq.heappush(self.replies, (time.monotonic() + host.delay, next(self._order), reply))
        else:
            self.pool.send({"reply": reply})

    def _refused_reply(self, message: dict[str, Any]) -> None:
        error = message.get("error") or {}
        match = _LATE_REFUSAL.match(error.get("message", "")) if error.get("type") == "RequestError" else None
        call_id = int(match.group(1)) if match else None
        if call_id is None or call_id not in self.late_pending:
            self.tally.problems.append(f"an answer with a null id that is no refused late reply: {_brief(message)}")
            return
        self.late_pending.discard(call_id)
        self.tally.results += 1
        self.tally.outcomes["request_errors"] += 1  # planned: the soak sent this reply to be refused
        self.tally.errors["RequestError"] += 1

    def _check(self, job: Job, result: dict[str, Any]) -> None:
        expect = job.expect
        problems = []
        if expect.outcome == "closed":
            if result.get("closed") is not True or result.get("session") != job.fields["session"]:
                problems.append("not a closed answer for its session")
        else:
            self.tally.results += 1
            self.tally.queue_us.append(int(result.get("queue_us", 0)))
            error = result.get("error")
            error_type = error["type"] if error else None
            if (result.get("exit"), error_type) != (expect.exit, expect.error):
                problems.append(f"exit/error {result.get('exit')}/{error_type}, planned {expect.exit}/{expect.error}")
            if expect.message is not None and (error is None or expect.message not in error["message"]):
                problems.append(f"the error message lacks {expect.message!r}")
            if expect.stdout is not None and result.get("stdout") != expect.stdout:
                problems.append(f"stdout {result.get('stdout', '')[:80]!r}, planned {expect.stdout[:80]!r}")
            if expect.truncated and not (result.get("stdout_truncated") and result.get("stderr_truncated")):
                problems.append("output not marked truncated")
            if not expect.truncated and (result.get("stdout_truncated") or result.get("stderr_truncated")):
                problems.append("output marked truncated")
            if expect.session_ended is not None and (result.get("session"), result.get("step"),
                                                     result.get("session_ended")) != (
                    job.fields["session"], expect.step, expect.session_ended):
                problems.append(f"session/step/ended {result.get('session')}/{result.get('step')}/"
                                f"{result.get('session_ended')}, planned {expect.step}/{expect.session_ended}")
        if problems:
            self.tally.problems.append(f"{job.kind} {job.fields['id']}: {'; '.join(problems)}: {_brief(result)}")

    def unanswered(self) -> list[str]:
        return sorted(self.flights)


def _brief(message: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[:200] if isinstance(v, str) else v) for k, v in message.items() if k not in ("runtime", "policy")}


# --- the pool seen from outside --------------------------------------------------------------------------


def fd_kinds(pid: int) -> Counter[str]:
    """Open descriptors by what they are (``pipe``, ``socket``, ``anon_inode:[pidfd]``, a path), without inodes."""
    kinds: Counter[str] = Counter()
    for target in procfs.fd_targets(pid).values():
        # A template's cgroup files are held per template: a replaced template's have another name, not more.
        kinds[re.sub(r"/template-\d+/", "/template-N/", re.sub(r":\[\d+\]$", "", target))] += 1
    return kinds


def threads(pid: int) -> int:
    return procfs.status_number(pid, "Threads")


def below(root: int) -> dict[int, tuple[int, str, str]]:
    """Every process below ``root``, zombies included: pid -> (depth, state, command name). The pool's zygote
    is left out and what it forked counts at its depth (a session's template is a template), as
    :func:`tests.pool.pool_driver.descendants` counts them."""
    table = proc_table()
    return {pid: (depth, table[pid][1], table[pid][3]) for pid, depth in pool_depths(root, table).items()
            if table[pid][3] != ZYGOTE}


@dataclass(frozen=True)
class Snapshot:
    pool_rss_kb: int
    template_rss_kb: dict[int, int]
    pool_fds: Counter[str]
    template_fds: dict[int, Counter[str]]
    pool_threads: int


def idle_snapshot(pool: PoolProcess, workers: int, deadline: float = 20.0, *, spare_prepared: bool = False) -> Snapshot:
    """Wait until the pool is idle (only its templates and their prepared children left), then measure it.

    Idle is what makes two snapshots comparable: no job, no session, no session template, no zombie. Once
    the pool has had a session, one template more waits for the next session, with a child prepared for it
    once a session's first step was answered; it is replaced with each new session, so the snapshot measures
    the workers' templates only (the pool's descriptors and threads still count the one waiting).
    """
    end = time.monotonic() + deadline
    while True:
        processes = below(pool.pid)
        table = proc_table()
        parents = {table_entry[0] for table_entry in table.values()}
        alive = [pid for pid, (depth, state, _) in processes.items() if depth == 1 and state != "Z"]
        # The template waiting for the next session: childless, or holding a child confined for that session.
        for_a_session = {table[pid][0] for pid in processes if pid in table and prepared_for_a_session(pid)}
        templates = sorted(pid for pid in alive if pid in parents and pid not in for_a_session)
        waiting = [pid for pid in alive if pid not in parents or pid in for_a_session]
        strays = {pid: info for pid, info in processes.items()
                  if info[1] == "Z" or info[0] > 2 or (info[0] == 2 and info[2] != "pynox-ready")}
        # With ``spare_prepared`` (the pool has had a session whose confinement another can share), idle also
        # means the template waiting for the next session holds the child it confines for it: the pool then
        # holds that child's control socket and pidfd in every snapshot.
        if (len(templates) == workers and len(waiting) <= 1 and not strays
                and len(processes) <= (1 + PREPARED_PER_WORKER) * workers + 2 * len(waiting)
                and (not spare_prepared or for_a_session)):
            # A template that has just forked a prepared child still holds the child's end of their socket
            # pair for a moment, and the pool takes the child's pidfd and control socket from the template's
            # frame a moment later: idle means their descriptors hold still too.
            template_fds = {pid: fd_kinds(pid) for pid in templates}
            pool_fds = fd_kinds(pool.pid)
            time.sleep(0.05)
            if template_fds == {pid: fd_kinds(pid) for pid in templates} and pool_fds == fd_kinds(pool.pid):
                break
        if time.monotonic() > end:
            raise AssertionError(f"the pool did not become idle within {deadline}s: below it {processes}")
        time.sleep(0.05)
    return Snapshot(
        pool_rss_kb=rss_kb(pool.pid),
        template_rss_kb={pid: rss_kb(pid) for pid in templates},
        pool_fds=fd_kinds(pool.pid),
        template_fds=template_fds,
        pool_threads=threads(pool.pid),
    )
