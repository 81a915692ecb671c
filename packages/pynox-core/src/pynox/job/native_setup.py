"""The child's setup with every step of :data:`~pynox.job.setup.CONFINE` after the first in one native call.

The same steps, in the same order, with the same rules (policy/native.py lays them out; ``_confine.c`` makes
the system calls); only the first, clearing the template's exit hooks, and the parts of the policy that are
Python's own state (``os.environ``, the signal module's handlers: SIGXFSZ ignored, and a session's interrupt
taken, see interrupts.py) stay in Python, made just before the call. Nothing in the child can send it a signal
before the call ends (the pool's interrupt finds its handler with no step allowed, and is dropped, as it would
be between the Python steps), so taking them first leaves the same process as taking them in their place. The checks the
Python steps make before their system calls (the grants' count, the descriptors' count, the memory floor)
are made where the call is laid out (``policy.native_call``: in the template, before the fork, so the child
touches one prepared tuple); when one failed, the call makes the steps before its own and stops, so the
child is left as the Python steps would leave it. A failure names the step it belongs to.
"""

from __future__ import annotations

from ..policy import base_environment, native_call
from ..policy.limits import ignore_file_size_signal
from ..policy.native import APPLY_POLICY, ARRANGE, BUILD_RULESET, TAKE_INTERRUPTS, NativeFailure
from .setup import CONFINE, Setup, Step, name_of, take_session_interrupts

__all__ = ["NATIVE_CONFINE", "confine_steps"]


def _confine_natively(setup: Setup) -> None:
    runtime, confinement = setup.runtime, setup.confinement
    call = setup.native_call or native_call(confinement, runtime, setup.grants, setup.sent, setup.targets,
                                            prepared=setup.prepared)
    failed = None
    try:  # before every check: the Python steps take them before building the ruleset
        take_session_interrupts(setup)
    except Exception as exc:
        failed = NativeFailure.of(TAKE_INTERRUPTS, str(exc))
    failed = failed or call.failed
    if failed is None:  # what is Python's own state, set where the Python steps set it: in the child
        try:
            if confinement.max_file_size is not None:
                ignore_file_size_signal()
            base_environment(confinement)
        except Exception as exc:
            failed = NativeFailure.of(APPLY_POLICY, str(exc))
    # A failed check stops the call before its step, so the child is left as the Python steps leave it (a
    # prepared child is named, in its own session, and waits for the job that will hear why).
    try:
        call.run(name_of(setup), failed.stage if failed is not None else 0)
        if failed is not None:
            raise failed
    except NativeFailure as failure:
        setup.arranged = failure.stage > ARRANGE
        raise
    setup.arranged = True


# The native call's stages are CONFINE's indices (policy/native.py, _confine.c): a step added to CONFINE must be
# added there too, or a failure would name the wrong step.
assert [CONFINE[stage].does for stage in (TAKE_INTERRUPTS, BUILD_RULESET, ARRANGE, APPLY_POLICY)] == [
    "take interrupts", "build the Landlock ruleset", "arrange descriptors", "apply the policy"], CONFINE
assert CONFINE[-1].does == "hand the metadata listener to the pool" and len(CONFINE) == APPLY_POLICY + 2, CONFINE

# CONFINE's first step, then the rest in one call.
NATIVE_CONFINE: tuple[Step, ...] = (CONFINE[0], Step("confine natively", _confine_natively))


def confine_steps(setup: Setup) -> tuple[Step, ...]:
    """The native steps when the template prepared them (``Runtime.native``), else the Python ones."""
    return NATIVE_CONFINE if setup.runtime.native is not None else CONFINE
