"""Pynox: run model-written Python in a fresh, kernel-confined process, in milliseconds."""

from .errors import (
    ConfigError,
    KernelSupportError,
    PoolError,
    PoolWorkerError,
    PynoxError,
    RequestError,
    SandboxSetupError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "KernelSupportError",
    "PoolError",
    "PoolWorkerError",
    "PynoxError",
    "RequestError",
    "SandboxSetupError",
    "__version__",
]
