"""Monty orchestrates, Pynox executes: two sandboxes, one agent.

The model writes glue code that runs in Monty (pydantic-monty), a restricted
Python subset with no filesystem or network. When that code needs real Python
with libraries, it calls ``run_python(code)``: an external function the host
resolves on a Pynox pool. The host, not the model, decides what the heavy code
may read and write. Requires ``pip install pydantic-monty`` and Linux.

Monty type-checks the glue code before it runs it (``type_check=True``), against
stubs the bridge writes for what it registers. Under ``AsyncMonty``, the glue
code awaits ``run_python``, and the calls it gathers run at once.

    python examples/monty_bridge.py
    # mean: 13
    # stored: {"mean": 13, "count": 3}
    # means, computed at once: [13, 4]
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pydantic_monty

import pynox
import pynox_monty

# What an LLM would write for the task "average these readings and store them".
# It runs inside Monty; `run_python` is the only way out of its sandbox.
AGENT_CODE = """
import json

job = run_python('''
import json, statistics
values = [3, 9, 27]
summary = {"mean": statistics.mean(values), "count": len(values)}
with open("{work_dir}/stats.json", "w") as f:
    json.dump(summary, f)
print(json.dumps(summary))
''')
if job["exit"] != 0:
    error = job["error"]
    raise RuntimeError(f"{error['type']} at line {error['line']}: {error['message']}")
json.loads(job["stdout"])["mean"]
"""


# The same agent, under AsyncMonty: two pieces of heavy code at once (a pool of two workers runs both).
AGENT_CODE_ASYNC = """
import asyncio

SCRIPT = 'import statistics\\nprint(statistics.mean({values}))'
jobs = await asyncio.gather(
    run_python(SCRIPT.format(values=[3, 9, 27])),
    run_python(SCRIPT.format(values=[2, 4, 6])),
)
for job in jobs:
    if job["exit"] != 0:
        raise RuntimeError(f"{job['error']['type']}: {job['error']['message']}")
[int(job["stdout"]) for job in jobs]
"""


def run_agent(work_dir: str | os.PathLike[str], *, binary: str | os.PathLike[str] | None = None) -> Any:
    work_dir = Path(work_dir)
    with pynox.Pool(workers=1, binary=binary) as pool, pydantic_monty.Monty() as monty:
        # Permissions are fixed here. The model never sees or chooses them.
        lookup = pynox_monty.external_lookup(pool, allow_read=[work_dir], allow_write=[work_dir], timeout="10s")
        # Checked before it runs: a misspelt key or a wrong argument fails here, before any heavy code starts.
        with monty.checkout(script_name="agent.py", type_check=True,
                            type_check_stubs=pynox_monty.type_stubs(lookup)) as session:
            return session.feed_run(AGENT_CODE.replace("{work_dir}", str(work_dir)), external_lookup=lookup)


async def run_agent_async(*, binary: str | os.PathLike[str] | None = None) -> Any:
    with pynox.Pool(workers=2, binary=binary) as pool:
        lookup = pynox_monty.async_external_lookup(pool, timeout="10s")
        async with pydantic_monty.AsyncMonty() as monty, monty.checkout(
                script_name="agent.py", type_check=True, type_check_stubs=pynox_monty.type_stubs(lookup)) as session:
            return await session.feed_run(AGENT_CODE_ASYNC, external_lookup=lookup)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pynox-monty-") as temporary:
        print("mean:", run_agent(temporary))
        print("stored:", (Path(temporary) / "stats.json").read_text())
    print("means, computed at once:", asyncio.run(run_agent_async()))
