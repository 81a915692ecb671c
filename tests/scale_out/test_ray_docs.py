"""docs/scale-out.md's example runs as its own program against the test cluster (``RAY_ADDRESS``), and prints
every ``#>`` line it promises, in order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"
_BLOCK = re.compile(r"^<!-- run-by: tests/scale_out/test_ray_docs.py -->\n```python\n(?P<body>.*?)^```", re.M | re.S)


def test_the_scale_out_example_runs_on_the_cluster(cluster: object, tmp_path: Path) -> None:
    blocks = [match.group("body") for match in _BLOCK.finditer(DOC.read_text(encoding="utf-8"))]
    assert blocks, "scale-out.md has no block for this test"
    for body in blocks:
        expected = [line.strip()[3:] for line in body.splitlines() if line.strip().startswith("#> ")]
        address = cluster.address  # type: ignore[attr-defined]
        done = subprocess.run([sys.executable, "-W", "error", "-c", body], cwd=tmp_path, capture_output=True,
                              text=True, timeout=90, env={**os.environ, "RAY_ADDRESS": address}, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        printed = done.stdout.splitlines()
        assert printed == expected, (printed, expected)


pytestmark = pytest.mark.timeout(120)
