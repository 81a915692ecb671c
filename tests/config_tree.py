"""The directory tree the config tests lay out: an operator's etc, data and work directories, a second
data directory beside the first (``srv/data2``, not beneath ``srv/data``), and places outside all of them.
One tree for the pure config tests and the pool's config tests alike."""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

from pynox.config import Config, load_config

__all__ = ["Tree", "make_tree"]


@dataclass
class Tree:
    root: Path
    etc: Path
    site: Path  # a package directory the config names, with one module in it
    data: Path  # holds orders.csv
    data2: Path
    work: Path
    outside: Path  # holds secret.txt
    app: Path

    def config(self, text: str, name: str = "pynox.toml", where: Path | None = None) -> Path:
        path = (where or self.etc) / name
        path.write_text(textwrap.dedent(text))
        return path

    def load(self, text: str) -> Config:
        return load_config(self.config(text))

    def ceiling(self, extra: str = "") -> Config:
        """data readable, work writable, plus any extra [pool.limits] lines."""
        return self.load(f"""
            [pool.limits]
            allow_read = ["{self.data}"]
            allow_write = ["{self.work}"]
            {textwrap.dedent(extra)}
        """)


def make_tree(tmp_path: Path) -> Tree:
    root = Path(os.path.realpath(tmp_path))
    tree = Tree(root=root, etc=root / "etc", site=root / "etc" / "site", data=root / "srv" / "data",
                data2=root / "srv" / "data2", work=root / "srv" / "work", outside=root / "outside",
                app=root / "app")
    for path in (tree.etc, tree.site, tree.data, tree.data2, tree.work, tree.outside, tree.app):
        path.mkdir(parents=True, exist_ok=True)
    (tree.site / "config_helpers.py").write_text("ANSWER = 'from the config'\n")
    (tree.data / "orders.csv").write_text("product,amount\n")
    (tree.outside / "secret.txt").write_text("secret\n")
    return tree
