"""A Jupyter kernel whose cells run in a kernel-confined Pynox session.

Installing the package makes a kernel named ``pynox`` visible to Jupyter in that environment; its cells
run in one Pynox session (IPython's shell inside it: magics, ``_``, ``Out``, rich display), under the
grants of its kernelspec, never the notebook's. ``pynox-jupyter install --allow-read data`` writes a
kernelspec with grants.
"""

from __future__ import annotations

from ._cli import KERNEL_NAME, install_kernelspec
from ._kernel import KernelSettings, PynoxKernel

__all__ = ["KERNEL_NAME", "KernelSettings", "PynoxKernel", "install_kernelspec"]
