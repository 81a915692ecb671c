"""docs/sandbox-contract.md names a test for every rule: keep it and the cases in step."""

from __future__ import annotations

import re
from pathlib import Path

from pynox import check

from .cases import CASES, WORKS

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "sandbox-contract.md"


def _named_in_contract() -> set[str]:
    return set(re.findall(r"`([a-z0-9_\[\]]+)`", CONTRACT.read_text()))


def test_every_case_is_in_the_contract() -> None:
    named = _named_in_contract()
    missing = [case.id for case in CASES if case.id not in named]
    assert not missing, f"cases the contract does not mention: {missing}"


def test_every_check_probe_is_in_the_contract() -> None:
    text = CONTRACT.read_text()
    missing = [spec.name for spec in check._PROBES if f"`{spec.name}`" not in text]
    assert not missing, f"pynox check probes the contract does not mention: {missing}"


def test_every_case_the_contract_names_exists() -> None:
    # Lines of the tables name cases in backticks; each must be a case, a probe or another known test.
    known = {case.id for case in CASES} | {spec.name for spec in check._PROBES}
    known |= {f"test_works_inside[{works.id}]" for works in WORKS} | {f"[{works.id}]" for works in WORKS}
    rows = [line for line in CONTRACT.read_text().splitlines() if line.startswith("|") and "---" not in line]
    # The last cell says what proves the row; remarks in parentheses may name fields, not tests.
    proofs = [re.sub(r"\([^)]*\)", "", row.rsplit("|", 2)[-2]) for row in rows]
    cited = {name for cell in proofs for name in re.findall(r"`([a-z0-9_]+(?:\[[a-z_]+\])?)`", cell)}
    cited = {name for name in cited if not name.startswith("test_")}
    assert len(cited) > 40, "the proof column was not found: the table layout changed"
    unknown = sorted(cited - known)
    assert not unknown, f"the contract cites tests that do not exist: {unknown}"
