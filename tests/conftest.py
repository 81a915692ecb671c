"""Shared fixtures: the host probe, the rule that CI never skips for want of a kernel feature, and root.

Sandbox tests need Landlock and seccomp. On a machine without them a test is
skipped with the reason, except in CI (``CI`` set), where a missing feature
fails the run: a green CI must mean the policy was really proven.

``@pytest.mark.needs_root("why")`` marks a test that cannot show what it shows without root, typically
the control run beside a denial, which proves the harm is possible when unconfined: for an ordinary user
the kernel refuses the harm anyway (a capability it needs), so the control would prove nothing. Run by
any other user such a test is skipped with its reason; as root (CI runs as root) it runs. Only a control
may need root, never the denial it stands beside.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator

import pytest

from pynox.policy import landlock, seccomp


def _missing_kernel_features() -> list[str]:
    missing = []
    if landlock.abi_version() < 1:
        missing.append("Landlock")
    if not seccomp.supported():
        missing.append("seccomp")
    return missing


MISSING = _missing_kernel_features()


@pytest.fixture(autouse=True)
def _kernel_features(request: pytest.FixtureRequest) -> None:
    if MISSING and request.node.get_closest_marker("pure") is None:
        reason = f"this kernel lacks {', '.join(MISSING)}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must prove the policy, not skip it", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _needs_root(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("needs_root")
    if marker is not None and os.geteuid() != 0:
        (why,) = marker.args  # every use says why: the reason is what a reader of the skip sees
        pytest.skip(f"needs root, the test runs as uid {os.geteuid()}: {why}")


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module() -> Iterator[None]:
    # An object a module leaked unclosed (a socket, an event loop) warns when it is collected; collect
    # here so the warning fails the module that leaked it, not whichever test runs next.
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _no_default_pool_left() -> Iterator[None]:
    # Pynox's process-wide default pool lives until the interpreter exits: started by a test in this
    # process, it would outlive it and fail every later test that counts the processes below this one.
    # A test that means to use it runs its program in a subprocess, as a user's program would.
    yield
    client = sys.modules.get("pynox.client.default")
    if client is not None and client._default is not None:
        client._close_default()
        pytest.fail("this test started Pynox's default pool in the test process (a tool or pool built with "
                    "no pool); run that program in a subprocess, or pass the test's pool", pytrace=False)
