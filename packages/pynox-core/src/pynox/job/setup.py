"""The child's fail-closed setup: one ordered list of named steps, whichever way the child came to its job.

A child is forked either for its job (:func:`pynox.job.child.run_job`: the job's descriptors come with
the fork) or ahead of it, for the job before (:func:`pynox.job.child.run_prepared`: they arrive on its
control socket once the server hands it a job). Both run :data:`CONFINE`, in its order, then
:data:`READ`; only what the steps work on differs (:class:`Setup`). A step that fails stops the list:
the job's code never runs, its report says which step could not be done (``setup_error``), and the
child exits with ``SETUP_FAILED_EXIT`` (125). Nothing is skipped because it failed, and nothing runs
unconfined.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import signal
import socket
from collections.abc import Callable

import msgspec

from ..policy import MAX_FD, Runtime, add_environment, build_ruleset, confine
from ..policy.limits import first_to_be_killed
from ..policy.native import HandOverCall, NativeCall, NativeFailure
from ..policy.privileges import set_parent_death_signal, set_process_name
from ..wire.descriptors import (
    CHANNEL,
    CLAIM,
    CONTROL,
    METADATA,
    OUTPUTS,
    PAYLOAD,
    RULESET,
    STAGING,
)
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.payload import claim, read_payload
from ..wire.spec import Confinement, Payload
from . import pynox_host
from .interrupts import take_interrupts
from .resolver import install_pinned_names

__all__ = ["CONFINE", "READ", "Setup", "Step", "arrange", "close_quietly", "name_of", "run_steps",
           "take_session_interrupts"]

_MAX_FD = MAX_FD


class Setup:
    """What the steps work on, for one child.

    ``sent``: the job's own descriptors as the child inherited them, each to be put at the number of the
    same place in ``targets``; ``prepared``: the child is confined ahead of its job, which it then awaits
    on ``CONTROL`` (it has no job yet: its outputs and report are /dev/null until the job's arrive)."""

    def __init__(self, confinement: Confinement, runtime: Runtime, grants: list[int], sent: list[int],
                 targets: tuple[int, ...], *, prepared: bool, native_call: NativeCall | None = None,
                 hand_over: HandOverCall | None = None) -> None:
        self.confinement, self.runtime, self.grants = confinement, runtime, grants
        self.sent, self.targets, self.prepared = sent, targets, prepared
        self.native_call = native_call  # laid out by the template before the fork (job/native_setup.py)
        self.hand_over = hand_over  # a prepared child's native hand-over, laid out the same way (job/child.py)
        self.arranged = False
        self.ruleset: int | None = None
        self.listener: int | None = None
        self.payload: Payload | None = None

    def handed(self, fds: list[int], targets: tuple[int, ...]) -> None:
        """A prepared child's job arrived: these are its descriptors now, arranged as :data:`CONFINE` would."""
        self.sent, self.targets, self.arranged = fds, targets, False
        arrange([*zip(fds, targets, strict=True), (0, 0)])
        self.arranged = True

    def at(self, number: int) -> int | None:
        """Where the descriptor that belongs at ``number`` is now: there once arranged, before that wherever
        the template had it (a setup failure is reported on the job's report descriptor, wherever it is)."""
        if self.arranged:
            return number
        return next((fd for fd, target in zip(self.sent, self.targets, strict=False) if target == number), None)


class Step(msgspec.Struct, frozen=True):  # not a dataclass: see Runtime (policy/__init__.py)
    """One step of the setup. ``does`` says what, as a failure names it: "could not <does>: <why>"."""

    does: str
    run: Callable[[Setup], None]


def _clear_exit_hooks(setup: Setup) -> None:
    atexit._clear()


def _be_first_to_be_killed(setup: Setup) -> None:
    first_to_be_killed()


def _die_with_the_template(setup: Setup) -> None:
    set_parent_death_signal(signal.SIGKILL)
    # Asked after the fork, so a template that died before the ask sent no signal: its child would go on
    # without it (reparented, holding the template's socket until it arranges its descriptors). It exits
    # instead, reporting nothing: nobody is left to report to, and the server, which saw the template end,
    # takes the job back.
    if os.getppid() != setup.runtime.pid:
        os._exit(SETUP_FAILED_EXIT)


def name_of(setup: Setup) -> str:
    return "pynox-ready" if setup.prepared else "pynox-session" if setup.confinement.session else "pynox-job"


def _name(setup: Setup) -> None:
    set_process_name(name_of(setup))


def _new_session(setup: Setup) -> None:
    os.setsid()


def take_session_interrupts(setup: Setup) -> None:
    if setup.confinement.session:
        take_interrupts()


def _build_ruleset(setup: Setup) -> None:
    setup.ruleset = build_ruleset(setup.confinement, setup.runtime, setup.grants)


def _arrange_descriptors(setup: Setup) -> None:
    if len(setup.sent) != len(setup.targets):
        raise ValueError(f"expected {len(setup.targets)} descriptors, got {len(setup.sent)}")
    assert setup.ruleset is not None
    # Standard input reads nothing, in every job: read-only, so writing to it fails as it would on a
    # terminal-less process, and the same whichever way the child came to its job.
    moves = [*zip(setup.sent, setup.targets, strict=True), (setup.ruleset, RULESET),
             (os.open("/dev/null", os.O_RDONLY), 0)]
    if setup.prepared:  # its warm-up writes; the job's own outputs and report replace these when it arrives
        moves += [(os.open("/dev/null", os.O_WRONLY), target) for target in OUTPUTS]
    arrange(moves)
    setup.arranged = True


def _apply_policy(setup: Setup) -> None:
    setup.listener = confine(setup.confinement, setup.runtime, RULESET)


def _hand_over_listener(setup: Setup) -> None:
    assert setup.listener is not None
    # A prepared child sends it on its control socket, and waits there for its job; a job's own child on
    # the metadata socket, which it then closes.
    pool = socket.socket(fileno=CONTROL if setup.prepared else METADATA)
    try:
        socket.send_fds(pool, [b"L"], [setup.listener])
    finally:
        if setup.prepared:
            pool.detach()
        else:
            pool.close()
    os.close(setup.listener)
    setup.listener = None


# In this order, and every one of them, or the code never runs.
CONFINE: tuple[Step, ...] = (
    # The template's exit hooks (its preloaded modules') are the template's business, not a job's: only the
    # job's own run at its end (see execute.py).
    Step("clear the template's exit hooks", _clear_exit_hooks),
    # Before the child allocates anything: from here on an OOM kill in the template's cgroup takes the
    # child, never the template.
    Step("be the first to be killed", _be_first_to_be_killed),
    # From here on the child dies with its template, as the policy makes it again after any change of
    # credentials (which clears it): a job never outlives the process that forked it.
    Step("die with the template", _die_with_the_template),
    # Operators tell from ps which children wait for a job and which serve one.
    Step("name the process", _name),
    # Out of the template's session and process group: no controlling terminal to type into (TIOCSTI), and
    # a signal to the template's group never reaches the job (nor the job's to the template's).
    Step("start a new session", _new_session),
    # A session's cancel interrupts its step first (KeyboardInterrupt, see interrupts.py): the template
    # ignores the pool's interrupt signal. A job that is not a session keeps it ignored: it is killed.
    Step("take interrupts", take_session_interrupts),
    # While the grant descriptors are still open: the rules are built from them (never by name, so a path
    # renamed since the server opened it grants nothing), and arranging closes them.
    Step("build the Landlock ruleset", _build_ruleset),
    # Each of the job's descriptors at its number (see wire/descriptors.py), and every other one the
    # template had open (its socket, its prepared rules, other jobs' grants) closed: nothing the template
    # holds is reachable once confined. Before the policy's rlimits, which cap the descriptor numbers.
    Step("arrange descriptors", _arrange_descriptors),
    # rlimits, environment, working directory, identity, Landlock, seccomp: policy/__init__.confine, in its
    # own order with its reasons.
    Step("apply the policy", _apply_policy),
    # Whoever holds the seccomp listener answers the job's delegated calls, so the job's code must never
    # see it: it goes to the pool, and no copy stays here, before the payload is read.
    Step("hand the metadata listener to the pool", _hand_over_listener),
)


def _read_job(setup: Setup) -> None:
    """Read the job, confined already: its environment, then its host functions, if any; then claim it.

    The claim (see :func:`pynox.wire.payload.new_claim`) makes a job run at most once: a job the server
    took back, to retry on another template, was never begun here. It is the last step before the code
    runs, so the pool knows from it alone whether the code may have run: a setup failure it reports is
    believed only while the claim is still there (see server/report.py)."""
    payload = read_payload(PAYLOAD)
    add_environment(payload.env)
    if setup.confinement.host_channel:
        pynox_host.install_host_module(payload.functions, CHANNEL)
    if payload.pinned is not None:  # allow_hosts: names resolve to what the pool resolved, and only those
        install_pinned_names(payload.pinned, payload.allow_hosts)
    if not claim(CLAIM):
        os._exit(SETUP_FAILED_EXIT)  # the server took the job back: it runs elsewhere, or nowhere
    os.close(CLAIM)
    setup.payload = payload


# After CONFINE, and in a prepared child only once its job has arrived: the payload is read confined, and
# only by the child that runs it (the template passes it on unread), so no process a later job is forked
# from ever holds it.
READ: tuple[Step, ...] = (Step("read the job", _read_job),)


def run_steps(setup: Setup, steps: tuple[Step, ...]) -> str | None:
    """Run ``steps`` in order; the setup error of the first that failed, None if none did."""
    for step in steps:
        try:
            step.run(setup)
        except BaseException as exc:  # fail closed: whatever went wrong, the code must not run
            # The native call's failure names the step of CONFINE it belongs to (job/native_setup.py).
            does = CONFINE[exc.stage].does if isinstance(exc, NativeFailure) else step.does
            return f"could not {does}: {exc}"
    return None


def arrange(moves: list[tuple[int, int]]) -> None:
    """Put each source descriptor at its target number and close every other descriptor.

    Every source is first duplicated above all targets, so no target can overwrite a source still to
    be moved, whatever numbers the template (or a hand-over's ``recvmsg``) happened to use.
    """
    staged = [(fcntl.fcntl(source, fcntl.F_DUPFD, STAGING), target) for source, target in moves]
    for fd, target in staged:
        os.dup2(fd, target)
    # Every number between two targets, and everything above them (whatever the template had open: its
    # socket, its prepared rules; the staged copies), closed a range at a time: a number not open is no
    # error there, where a close of each number below STAGING raised and caught an OSError for most of them.
    # (An empty range is never asked: CPython's closerange can take one for "from here on".)
    start = 0
    for target in sorted({target for _, target in moves}):
        if start < target:
            os.closerange(start, target)
        start = target + 1
    os.closerange(start, _MAX_FD)


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
