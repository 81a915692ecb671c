"""The ``packages`` grant: distributions a job asks the pool to install, as names with version specifiers.

Only the plain form is accepted, ``name`` or ``name<op>version[,<op>version...]`` (``numpy``,
``pandas>=2,<3``, ``tinypkg==1.0``): no extras, markers, URLs, paths or options, because every other
form either reaches past the operator's index (a URL, a path, ``--index-url``) or is not something the
ceiling can judge. Names compare normalized (PEP 503: ``Foo_Bar`` is ``foo-bar``).

The ceiling (``[pool.limits] packages``) lists the same form: a request's name must be one it lists, and
the ceiling's specifiers for that name bound the versions the pool may install (they are handed to the
installer as constraints, so a request cannot widen them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import RequestError, quoted

__all__ = ["MAX_PACKAGES", "PACKAGE_RULE", "Requirement", "check_packages", "parse_requirement", "requirements"]

MAX_PACKAGES = 64  # distributions per request
_MAX_TEXT = 200
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9][A-Za-z0-9.+!*_-]*"
_CLAUSE = rf"(?:===|==|!=|~=|<=|>=|<|>)\s*{_VERSION}"
_FORM = re.compile(rf"\s*({_NAME})\s*((?:{_CLAUSE})(?:\s*,\s*{_CLAUSE})*)?\s*")
PACKAGE_RULE = ('is not a package name with optional version specifiers, e.g. "numpy" or "pandas>=2,<3" '
                "(no extras, markers, URLs, paths or options)")


@dataclass(frozen=True, order=True)
class Requirement:
    name: str  # normalized
    specifier: str  # "" or the clauses, spaces removed, sorted

    def __str__(self) -> str:
        return f"{self.name}{self.specifier}"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text: object, field: str = "packages") -> Requirement:
    """One entry of a ``packages`` list; :class:`RequestError` naming ``field`` for any other form."""
    if not isinstance(text, str) or len(text) > _MAX_TEXT or (found := _FORM.fullmatch(text)) is None:
        raise RequestError(f"{field}: {quoted(text)} {PACKAGE_RULE}")
    clauses = sorted(re.sub(r"\s+", "", clause) for clause in (found.group(2) or "").split(",") if clause.strip())
    return Requirement(_normalized(found.group(1)), ",".join(clauses))


def requirements(values: Iterable[object] | None, field: str = "packages") -> tuple[Requirement, ...]:
    """A ``packages`` list, parsed, deduplicated and sorted (the same set in any order is the same set)."""
    parsed = sorted({parse_requirement(value, field) for value in values or ()})
    if len(parsed) > MAX_PACKAGES:
        raise RequestError(f"{field}: at most {MAX_PACKAGES} packages per request, got {len(parsed)}")
    return tuple(parsed)


def check_packages(asked: Sequence[Requirement], allowed: Sequence[Requirement] | None) -> None:
    """Every name ``asked`` must be one the ceiling lists (``allowed``; ``None``: no ceiling); its versions
    are then bounded by the ceiling's specifiers when the pool installs it."""
    if allowed is None:
        return
    names = {requirement.name for requirement in allowed}
    for requirement in asked:
        if requirement.name not in names:
            listed = ", ".join(sorted(str(r) for r in allowed)) or "none"
            raise RequestError(f"packages: {requirement.name} is not among the packages the [pool.limits] ceiling "
                               f"allows (allowed: {listed}); work with those, or ask the operator to allow it")
