"""What this test run's setup offers the sandbox: the Landlock ABI jobs get, and whether it was capped.

CI runs the sandbox suite again with ``$PYNOX_LANDLOCK_ABI`` set to each older ABI (see ``.ci/run``): a pool
then confines jobs exactly as a kernel of that ABI would. A case that needs a newer ABI is skipped then,
with the reason; on a kernel that really lacks it, CI fails instead (a green CI must mean the policy was
proven), as ``tests/conftest.py`` does for a kernel without Landlock.
"""

from __future__ import annotations

import os

import pytest

from pynox.config import landlock_abi_from_environment
from pynox.policy import landlock
from tests.harness import procfs

__all__ = ["CAP", "KERNEL_ABI", "LANDLOCK_ABI", "OUTER_SECCOMP", "require_landlock"]

KERNEL_ABI = landlock.abi_version()
CAP = landlock_abi_from_environment()
LANDLOCK_ABI = KERNEL_ABI if CAP is None else min(KERNEL_ABI, CAP)


def _outer_seccomp() -> bool:
    return any(line.split() == ["Seccomp:", "2"] for line in procfs.read("self", "status").splitlines())


# Whether this run itself is under a seccomp filter (tests/setups/container.py, a real container): controls
# that make a call such a profile refuses cannot show the harm there.
OUTER_SECCOMP = _outer_seccomp()


def require_landlock(abi: int) -> None:
    """Skip (or, in CI on a kernel that lacks it, fail) a test that needs Landlock ABI ``abi``."""
    if abi <= LANDLOCK_ABI:
        return
    if abi <= KERNEL_ABI:
        pytest.skip(f"needs Landlock ABI {abi}; this run confines jobs as ABI {LANDLOCK_ABI} "
                    f"($PYNOX_LANDLOCK_ABI={CAP})")
    reason = f"needs Landlock ABI {abi}, this kernel has {KERNEL_ABI}"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must prove the policy, not skip it", pytrace=False)
    pytest.skip(reason)
