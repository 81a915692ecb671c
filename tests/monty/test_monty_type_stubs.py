"""Type stubs for Monty's checker: ``type_check=True`` passes the spec's glue code and catches its mistakes."""

from __future__ import annotations

import ast
import datetime
import functools
from pathlib import Path
from typing import Literal

import pydantic_monty
import pytest

import pynox
from pynox_monty import external_lookup, type_stubs

from .glue import feed, spec_glue

pytestmark = pytest.mark.timeout(90)


def price(product: str, *, currency: Literal["EUR", "USD"] = "EUR") -> float:
    """The catalogue price."""
    return 25.0 if product == "lamp" else 180.0


def test_the_spec_glue_code_type_checks_and_runs(pool: pynox.Pool, monty: pydantic_monty.Monty,
                                                 tmp_path: Path) -> None:
    lookup = external_lookup(pool, allow_read=[tmp_path], allow_write=[tmp_path])
    # Without stubs the checker knows no run_python: the failure the stubs are for.
    with pytest.raises(pydantic_monty.MontyTypingError, match="`run_python` used when not defined"):
        feed(monty, spec_glue(tmp_path), lookup, type_check=True)
    assert feed(monty, spec_glue(tmp_path), lookup, type_check=True, type_check_stubs=type_stubs(lookup)) == 13
    assert (tmp_path / "stats.json").read_text() == '{"mean": 13, "count": 3}'


@pytest.mark.parametrize(("glue", "complaint"), [
    ("run_python(42)", "Expected `str`, found `Literal[42]`"),
    ("run_python('print(1)')['stdot']", 'Unknown key "stdot"'),
    ("run_python('print(1)')['error']['hint_text']", 'Unknown key "hint_text"'),
    ("run_python('print(1)', timeout=[5])", "Argument to function `run_python` is incorrect"),
    ("x: int = run_python('print(1)')['stdout']", "`str` is not assignable to `int`"),
    ("price(3)", "Expected `str`, found `Literal[3]`"),
    ("price('lamp', currency='GBP')", "Literal[\"EUR\", \"USD\"]"),
    ("price('lamp').upper()", "has no attribute `upper`"),
])
def test_the_stubs_catch_the_glue_codes_mistakes_before_it_runs(pool: pynox.Pool, monty: pydantic_monty.Monty,
                                                                glue: str, complaint: str) -> None:
    calls: list[str] = []

    def spy(product: str, *, currency: Literal["EUR", "USD"] = "EUR") -> float:
        calls.append(product)
        return price(product, currency=currency)

    lookup = external_lookup(pool, functions={"price": functools.wraps(price)(spy)})
    before = pool.stats()["jobs"]
    with pytest.raises(pydantic_monty.MontyTypingError) as caught:
        feed(monty, glue, lookup, type_check=True, type_check_stubs=type_stubs(lookup), type_check_format="concise")
    assert complaint in str(caught.value)
    assert calls == [] and pool.stats()["jobs"] == before  # rejected before anything ran


def test_host_functions_type_check_as_their_signatures_say(pool: pynox.Pool, monty: pydantic_monty.Monty) -> None:
    lookup = external_lookup(pool, functions={"price": price})
    glue = ("heavy = run_python('from pynox_host import price\\nprint(price(\"lamp\") * 2)')\n"
            "[price('lamp', currency='USD') * 2, heavy['stdout']]")
    assert feed(monty, glue, lookup, type_check=True, type_check_stubs=type_stubs(lookup)) == [50.0, "50.0\n"]


def _typed_dict_keys(stubs: str) -> dict[str, set[str]]:
    """Each class of the stubs, with the keys it declares."""
    return {node.name: {item.target.id for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
            for node in ast.parse(stubs).body if isinstance(node, ast.ClassDef)}


def test_the_stubs_declare_exactly_the_keys_a_result_has(pool: pynox.Pool, monty: pydantic_monty.Monty) -> None:
    lookup = external_lookup(pool)
    classes = _typed_dict_keys(type_stubs(lookup))
    returned = ast.parse(type_stubs(lookup)).body
    run_python = next(node for node in returned if isinstance(node, ast.FunctionDef) and node.name == "run_python")
    assert run_python.returns is not None
    result_class = ast.unparse(run_python.returns)
    failed = feed(monty, "run_python('def f():\\n    open(\"/etc/shadow\")\\nf()')", lookup)
    assert set(failed) == classes[result_class]
    assert set(failed["error"]) == classes["RunPythonError"]
    assert failed["error"]["traceback"] and all(set(frame) == classes["RunPythonFrame"]
                                                for frame in failed["error"]["traceback"])
    assert set(feed(monty, "run_python('print(1)')", lookup)) == classes[result_class]


class Order:
    """A host type the glue code has no declaration of."""


def test_signatures_are_spelled_for_the_checker() -> None:
    def untyped(a, b=1, *rest, key, **more):  # type: ignore[no-untyped-def]
        return a

    def plain(names: list[str], /, limits: dict[str, int] | None = None, *, when: datetime.date | None = None,
              mode: Literal["fast", 2, True, None] = "fast", pair: tuple[int, ...] = (1,)) -> bool | None:
        return None

    async def fetch(order: Order, flags: set[bytes]) -> Order:
        return order

    stubs = type_stubs({"untyped": untyped, "plain": plain, "fetch": fetch, "budget": 25.0, "owner": Order(),
                        "labels": ["a"]})
    lines = [line for line in stubs.splitlines() if line.startswith(("def ", "async def ", "budget", "owner",
                                                                     "labels"))]
    assert "run_python" not in stubs  # only what the mapping holds
    assert lines == [
        "def untyped(a, b=..., *rest, key, **more): ...",
        "def plain(names: list[str], /, limits: dict[str, int] | None = ..., *, when: Any | None = ..., "
        "mode: Literal['fast', 2, True, None] = ..., pair: tuple[int, ...] = ...) -> bool | None: ...",
        "async def fetch(order: Any, flags: set[bytes]) -> Any: ...",
        "budget: float",
        "owner: Any",
        "labels: list",
    ]


def test_stubs_of_a_name_no_glue_code_could_call_are_refused() -> None:
    with pytest.raises(ValueError, match="'not a name' is not a Python identifier"):
        type_stubs({"not a name": price})
    with pytest.raises(ValueError, match="'RunPythonResult' is the name of one of the stubs' own types"):
        type_stubs({"RunPythonResult": price})


def test_each_stub_is_one_the_checker_accepts(monty: pydantic_monty.Monty) -> None:
    def plain(names: list[str], /, limits: dict[str, int] | None = None, *, when: datetime.date | None = None,
              mode: Literal["fast", 2, True, None] = "fast") -> bool | None:
        return None

    stubs = type_stubs({"plain": plain, "budget": 25.0, "labels": ["a"]})
    glue = "r: bool | None = plain(['a'], {'x': 1}, mode=2)\nb: float = budget\nl: list[Any] = labels\nr"
    assert feed(monty, "from typing import Any\n" + glue, {"plain": plain, "budget": 25.0, "labels": ["a"]},
                type_check=True, type_check_stubs=stubs) is None

