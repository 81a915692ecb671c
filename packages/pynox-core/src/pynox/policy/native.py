"""The child's confinement in one native call (``_confine.c``), from what the template prepared once.

The Python steps of job/setup.py (:data:`~pynox.job.setup.CONFINE`) each write objects of the template's
heap, and every page a child writes is a copy-on-write fault: about a millisecond of a job went there. The
native path makes the same system calls, in the same order, from arguments laid out here: the seccomp
programs are the bytes libseccomp compiled in the template (``Runtime.filters``), the own-process program is
the same bytes with the indices where the child writes its pid, the Landlock rules are the same descriptors
and rights, the limits the same list (:func:`pynox.policy.limits.wanted_limits`).

Which path a template's children take (``Runtime.native``): the native one when the extension loads, unless
``$PYNOX_NATIVE`` is ``0`` (the Python steps, the fallback; CI runs one matrix leg on it); ``1`` requires it.
tests/sandbox/test_native_confine.py reads what each path installed from outside the child and compares.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..extensions import load
from ..wire.spec import Confinement
from . import landlock
from .own_process import OwnProcessFilter
from .privileges import SECUREBITS

if TYPE_CHECKING:
    from .seccomp import LoadableFilter

__all__ = ["APPLY_POLICY", "ARRANGE", "BUILD_RULESET", "TAKE_INTERRUPTS", "HandOverCall", "NativeCall", "NativeFailure",
           "NativePlan", "hand_over_call", "load_error", "path_identities", "plan"]

_confine, _load_error = load("pynox.policy", "_confine")


def path_identities(paths: tuple[bytes, ...]) -> bytes | None:
    """The (st_dev, st_ino) of each path packed as native uint64 pairs ((0, 0) for a path that cannot be
    stat'ed), in one native call; None where the extension did not load."""
    if _confine is None:
        return None
    identities: bytes = _confine.identities(paths)
    return identities


# A prepared child's hand-over in one native call (``_confine.take_job``), and its arguments: laid out by the template.
HandOverCall = tuple[Callable[..., int], tuple[object, ...]]


def hand_over_call(control: int, targets: tuple[int, ...], name: str, staging: int, max_fd: int,
                   max_frame: int) -> HandOverCall | None:
    """What a prepared child calls once confined to take its job (job/child.py), laid out in the template; None
    where the extension did not load (the Python path takes it). ``targets``: each handed descriptor's number,
    in the order the server sends them, then standard input's (0), which stays where it is."""
    if _confine is None:
        return None
    return _confine.take_job, (control, targets, len(targets) - 1, name.encode()[:15], staging, max_fd, max_frame)


def load_error() -> str | None:
    """Why the native confinement cannot load here, or None when it can."""
    return _load_error


class NativeFailure(Exception):
    """A step of the native call failed: ``stage`` is its index in ``setup.CONFINE``, so the setup error
    names the same step as the Python path's would."""

    def __init__(self, stage: int, err: int, what: str) -> None:
        super().__init__(f"[Errno {err}] {what}: {os.strerror(err)}")
        self.stage = stage

    @classmethod
    def of(cls, stage: int, message: str) -> NativeFailure:
        """A failure of a check made in Python before the call, with its own message."""
        failure = cls(stage, 0, "")
        failure.args = (message,)
        return failure


# The steps of setup.CONFINE whose checks (or, for the interrupts, whose Python state) are made before the call
# (their indices there; job/native_setup.py checks them against CONFINE's names when it loads).
TAKE_INTERRUPTS, BUILD_RULESET, ARRANGE, APPLY_POLICY = 5, 6, 7, 8


# Frozen msgspec.Structs, not dataclasses: see Runtime (policy/__init__.py).
class NativeCall(msgspec.Struct, frozen=True):
    """One child's call, laid out before the fork by the template (so the child touches one prepared tuple
    instead of building its arguments), or by the child itself: every argument but the process's name, and
    the first check of the Python steps that failed, if one did (``failed``)."""

    args: tuple[object, ...]
    failed: NativeFailure | None

    def run(self, name: str, stop_before: int) -> None:
        """Run every step of ``setup.CONFINE`` after the first, natively, or those before ``stop_before``;
        :class:`NativeFailure` names the first that failed (nothing after it ran)."""
        assert _confine is not None
        failed = _confine.confine(name.encode()[:15], stop_before, self.args)
        if failed is not None:
            raise NativeFailure(*failed)


class NativePlan(msgspec.Struct, frozen=True):
    """What every child of a template passes to the native call unchanged, laid out once."""

    own_program: bytes
    own_patches: tuple[tuple[int, int], ...]  # (instruction index, 1 if it takes -pid)
    securebits: int

    def lay_out(self, *, parent_pid: int, exit_status: int, abi: int, network_all: bool,
                prepared_rules: tuple[tuple[int, int], ...], granted_rules: list[tuple[int, int]],
                own_entries: tuple[tuple[bytes, int], ...], moves: list[tuple[int, int]], ruleset_target: int,
                null_read: tuple[int, ...], null_write: tuple[int, ...], staging: int, max_fd: int,
                limits: list[tuple[int, int, int]], confinement: Confinement, main_filter: LoadableFilter,
                handover: int, keep_handover: bool, failed: NativeFailure | None) -> NativeCall:
        """``granted_rules`` are fitted to what each descriptor names in the call, as
        :func:`landlock.fitting` does. ``main_filter``'s merged program when it has one (the own-process
        filter in it: the call installs one filter, its pid written in), else the two stacked."""
        handled_fs, handled_net, scoped, size = landlock.ruleset_attr(abi, network=network_all)
        uid = confinement.uid if confinement.uid is not None else -1
        gid = confinement.gid if confinement.gid is not None else confinement.uid if confinement.uid is not None else -1
        return NativeCall((
            parent_pid, exit_status, handled_fs, handled_net, scoped, size, prepared_rules, granted_rules,
            landlock.FILE_RIGHTS, own_entries, moves, ruleset_target, null_read, null_write, staging, max_fd,
            limits, os.fsencode(confinement.cwd), uid, gid, self.securebits,
            main_filter.merged.program if main_filter.merged is not None else main_filter.compiled.bpf,
            b"" if main_filter.merged is not None else self.own_program, self.own_patches, handover, keep_handover),
            failed)


def plan(own_process: OwnProcessFilter) -> NativePlan | None:
    """The plan, or None when the extension did not load (the Python steps confine)."""
    if _confine is None:
        return None
    return NativePlan(own_process.program, own_process.negations(), SECUREBITS)
