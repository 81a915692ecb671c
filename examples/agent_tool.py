"""Give an agent a Python tool with the `pynox` package.

Register the function `pynox.tool()` returns in any framework that accepts a
typed, documented Python function. Each call runs in a fresh sandboxed
process; the host decides the permissions here, the model only writes code.

    python examples/agent_tool.py
"""

import atexit
import shutil
import sys
import tempfile

import pynox

# The one directory the model's code may write: a fresh one, not all of /tmp (a write grant that
# contains the interpreter or its packages, such as a virtual environment under /tmp, is refused).
WORK = tempfile.mkdtemp(prefix="pynox-agent-")
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

# One pool for the application. Permissions per call, or per profile in pynox.toml.
run_python = pynox.tool(allow_write=[WORK], timeout="10s", memory="256m")

if __name__ == "__main__":
    try:
        print(run_python.__doc__)
        print(run_python("import sys\nprint('Hello from an agent tool', sys.argv)"))
        print(run_python("open('/etc/passwd').read()"))
    except (pynox.KernelSupportError, pynox.ConfigError) as exc:  # this machine or its config: the operator's
        sys.exit(f"{type(exc).__name__}: {exc}")
