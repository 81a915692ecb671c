"""One job outside a pool: start a template, run the job, stop the template.

``pynox run`` and the self-test of ``pynox check`` use it. It pays the
template start (about 90 ms) per call; anything that runs more than one job
belongs on a pool.
"""

from __future__ import annotations

import os
from typing import Literal

import msgspec

from ..config import EMPTY, Config
from ..errors import RequestError
from ..grants import enforce_ceiling
from ..protocol import Request, Result
from .jobs import to_job
from .outcome import to_result
from .packages import Installer
from .templates import Template

__all__ = ["run_on", "run_once"]


def run_on(template: Template, request: Request, *, cwd: str, hint_style: Literal["api", "cli"] = "api",
           mode: str = "run", config: Config = EMPTY) -> Result:
    """Resolve ``request`` and run it on ``template``; raises ``RequestError`` for a bad request. The packages
    it names are installed first, as ``config``'s [pool] says and under its [pool.limits] packages."""
    installer = Installer(config.pool.installs, ceiling=config.limits.packages if config.limits else ())
    if request.packages and config.limits is not None:
        enforce_ceiling(config.limits, request, cwd, check_paths=False)
    spec, max_output = to_job(request, cwd=cwd, runtime_paths=[*template.ready.read_paths, installer.root],
                              hint_style=hint_style)
    if installer.problem() is None:
        spec = installer.place(msgspec.structs.replace(
            spec, confinement=msgspec.structs.replace(spec.confinement, installs_packages=True)))
    elif spec.packages:
        raise RequestError(f"packages: {installer.problem()}")
    outcome = template.run(spec, max_output=max_output).freeze(spec, spec.confinement.timeout)
    return to_result(request.id, outcome, spec, max_output=max_output, python=template.ready.python,
                     preloaded=template.ready.preloaded, landlock_abi=template.ready.landlock_abi, mode=mode)


def run_once(request: Request, *, hint_style: Literal["api", "cli"] = "api", cwd: str | None = None,
             config: Config = EMPTY) -> Result:
    """Run ``request`` in a fresh template. Raises ``RequestError`` for a bad request, ``PoolError`` if the
    template cannot start (``KernelSupportError``'s message arrives inside it)."""
    template = Template([], [])
    try:
        return run_on(template, request, cwd=cwd or os.getcwd(), hint_style=hint_style, config=config)
    finally:
        template.close()
