"""The child's setup with every step of :data:`~pynox.job.setup.CONFINE` after the first in one native call.

The same steps, in the same order, with the same rules (policy/native.py lays them out; ``_confine.c`` makes
the system calls); only the first, clearing the template's exit hooks, and the parts of the policy that are
Python's own state (``os.environ``, the signal module's handler for SIGXFSZ) stay in Python. The checks the
Python steps make before their system calls (the grants' count, the descriptors' count, the memory floor)
are made first here; when one fails, the call makes the steps before its own and stops, so the child is left
as the Python steps would leave it. A failure names the step it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable

from ..policy import OWN_ENTRY_RIGHTS, base_environment, check_memory, granted_rights, prepared_rules
from ..policy.limits import ignore_file_size_signal, wanted_limits
from ..policy.native import NativeFailure
from ..wire.descriptors import CONTROL, METADATA, REPORT, RULESET, STAGING, STDERR, STDOUT
from ..wire.exits import SETUP_FAILED_EXIT
from .setup import _MAX_FD, CONFINE, Setup, Step, name_of

__all__ = ["NATIVE_CONFINE", "confine_steps"]

_BUILD_RULESET, _ARRANGE, _APPLY_POLICY = 5, 6, 7
_OWN_ENTRIES = tuple((entry.encode(), rights) for entry, rights in OWN_ENTRY_RIGHTS)


def _checked(checks: tuple[tuple[int, Callable[[], None]], ...]) -> NativeFailure | None:
    """The checks of the Python steps, made before the call; the first that fails, as its step's failure."""
    for stage, check in checks:
        try:
            check()
        except Exception as exc:
            return NativeFailure.of(stage, str(exc))
    return None


def _confine_natively(setup: Setup) -> None:
    runtime, confinement = setup.runtime, setup.confinement
    assert runtime.native is not None
    granted: list[tuple[int, int]] = []

    def grants() -> None:
        granted.extend(granted_rights(confinement, runtime, setup.grants))

    def counted() -> None:
        if len(setup.sent) != len(setup.targets):
            raise ValueError(f"expected {len(setup.targets)} descriptors, got {len(setup.sent)}")

    def policy() -> None:
        check_memory(confinement, runtime)
        if confinement.max_file_size is not None:
            ignore_file_size_signal()
        base_environment(confinement)

    # A failed check stops the call before its step, so the child is left as the Python steps leave it (a
    # prepared child is named, in its own session, and waits for the job that will hear why).
    failed = _checked(((_BUILD_RULESET, grants), (_ARRANGE, counted), (_APPLY_POLICY, policy)))
    try:
        runtime.native.confine(
            parent_pid=runtime.pid, exit_status=SETUP_FAILED_EXIT, name=name_of(setup), abi=runtime.landlock_abi,
            network_all=confinement.network == "all", prepared_rules=prepared_rules(confinement, runtime),
            granted_rules=granted, own_entries=_OWN_ENTRIES, moves=list(zip(setup.sent, setup.targets, strict=False)),
            ruleset_target=RULESET, null_read=(0,), null_write=(STDOUT, STDERR, REPORT) if setup.prepared else (),
            staging=STAGING, max_fd=_MAX_FD,
            limits=wanted_limits(memory=confinement.memory,
                                 timeout=None if confinement.session else confinement.timeout,
                                 max_file_size=confinement.max_file_size, max_open_files=confinement.max_open_files),
            confinement=confinement, main_filter=runtime.filters[confinement.network].compiled.bpf,
            handover=CONTROL if setup.prepared else METADATA, keep_handover=setup.prepared,
            stop_before=failed.stage if failed is not None else 0)
        if failed is not None:
            raise failed
    except NativeFailure as failure:
        setup.arranged = failure.stage > _ARRANGE
        raise
    setup.arranged = True


# CONFINE's first step, then the rest in one call.
NATIVE_CONFINE: tuple[Step, ...] = (CONFINE[0], Step("confine natively", _confine_natively))


def confine_steps(setup: Setup) -> tuple[Step, ...]:
    """The native steps when the template prepared them (``Runtime.native``), else the Python ones."""
    return NATIVE_CONFINE if setup.runtime.native is not None else CONFINE
