"""Monty orchestrates, Pynox executes: an agent whose glue code runs in Monty and hands pandas to Pynox.

The model is SCRIPTED (one fixed piece of glue code, then its answer): no model service is reachable
here. The glue code runs in Monty (pydantic-monty: a Python subset with no files, imports or network,
type-checked before it runs). Its only way to real Python is ``run_python(code)``, which the host
resolves on a Pynox pool whose jobs may read ``data/`` and nothing else. The glue checks each job's
exit and error, and combines the two results itself.

    python examples/monty_agent.py
"""

from __future__ import annotations

import json
import os
import tempfile

import pydantic_monty

import pynox
import pynox_monty

ORDERS = "product,amount\nlamp,25.00\ndesk,180.00\nlamp,12.50\nchair,95.00\n"
QUESTION = "What share of our revenue comes from lamps?"

# The scripted model's glue code: Monty runs it; each run_python(...) is one confined Pynox job.
GLUE = '''
import json

def heavy(code: str) -> dict:
    job = run_python(code)
    if job["exit"] != 0:
        raise RuntimeError(f"{job['error']['type']}: {job['error']['message']}")
    return json.loads(job["stdout"])

total = heavy("import json, pandas as pd\\n"
              "print(json.dumps({'total': float(pd.read_csv('data/orders.csv')['amount'].sum())}))")
lamps = heavy("import json, pandas as pd\\n"
              "df = pd.read_csv('data/orders.csv')\\n"
              "print(json.dumps({'lamps': float(df[df['product'] == 'lamp']['amount'].sum())}))")
{"total": total["total"], "lamps": lamps["lamps"], "share": round(100 * lamps["lamps"] / total["total"], 1)}
'''


def main() -> None:
    print(f"user: {QUESTION}")
    print("model (scripted) writes glue code for Monty:")
    print("\n".join(f"    {line}".rstrip() for line in GLUE.strip().splitlines()))
    with pynox.Pool(workers=1, preload=["pandas"]) as pool, pydantic_monty.Monty() as monty:
        lookup = pynox_monty.external_lookup(pool, allow_read=["data"], timeout="20s")
        with monty.checkout(script_name="agent.py", type_check=True,
                            type_check_stubs=pynox_monty.type_stubs(lookup)) as session:
            value = session.feed_run(GLUE, external_lookup=lookup)
    print(f"monty returned: {json.dumps(value)}")
    print(f"model (scripted): Lamps bring {value['lamps']:.2f} of {value['total']:.2f} EUR, "
          f"{value['share']}% of revenue.")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="pynox-monty-agent-") as work:
        os.chdir(work)  # the pool resolves the relative grant here
        os.makedirs("data")
        with open("data/orders.csv", "w") as csv:
            csv.write(ORDERS)
        main()
        os.chdir("/")
