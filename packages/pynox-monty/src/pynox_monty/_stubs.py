"""Type stubs for Monty's checker (``checkout(type_check=True, type_check_stubs=...)``).

Monty's checker knows nothing of the names ``external_lookup`` serves, so glue code that calls them fails
it (``Name 'run_python' used when not defined``). :func:`type_stubs` declares each one: ``run_python`` with
its result's keys, a host function with its own signature, a value with its type.

A stub can only name types the glue code has: builtins, their generics, ``Literal`` and unions of them. Any
other annotation (a dataclass, a date, a model of the host's) is spelled ``Any``, which the checker accepts
whatever the glue code does with it.
"""

from __future__ import annotations

import inspect
import keyword
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ._result import STUB_TYPE_NAMES, STUB_TYPES

__all__ = ["declare", "type_stubs"]

# Functions of this package whose stub is not their Python signature: a `run_python` returns a
# RunPythonResult, which only the stubs define.
_DECLARED: weakref.WeakKeyDictionary[Callable[..., Any], str] = weakref.WeakKeyDictionary()
_HEADER = "from typing import Any, Literal, TypedDict\n"
_BUILTINS: dict[Any, str] = {cls: cls.__name__ for cls in (int, float, complex, str, bytes, bool, list, dict, tuple,
                                                           set, frozenset, object)}
_BUILTINS[type(None)] = "None"


def declare(function: Callable[..., Any], signature: str) -> None:
    """Give ``function`` the stub signature ``(...) -> T`` instead of the one its annotations spell."""
    _DECLARED[function] = signature


def type_stubs(lookup: Mapping[str, Any]) -> str:
    """The ``type_check_stubs`` that declare every name of ``lookup`` (what :func:`external_lookup` or
    :func:`async_external_lookup` returned, with any entries of your own) to Monty's type checker.

    An ``async def`` function is declared async: the glue code must await it. Add stubs of your own
    after these. Raises ``ValueError`` for a name glue code could not call.
    """
    declarations = []
    for name, value in lookup.items():
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{name!r} is not a Python identifier: glue code cannot name it")
        if name in STUB_TYPE_NAMES:
            raise ValueError(f"{name!r} is the name of one of the stubs' own types: give the entry another name")
        declarations.append(_declaration(name, value))
    return "\n\n".join([_HEADER, STUB_TYPES.rstrip("\n"), *declarations]) + "\n"


def _declaration(name: str, value: Any) -> str:
    if not callable(value):
        return f"{name}: {_spelled(type(value))}"
    prefix = "async def" if inspect.iscoroutinefunction(value) else "def"
    try:
        signature = _DECLARED.get(value)
    except TypeError:  # a callable object that cannot be a dict key is none of ours
        signature = None
    if signature is None:
        signature = _signature(value)
    return f"{prefix} {name}{signature}: ..."


class _Spelled(str):
    """Stub text standing in for an annotation or a default: ``inspect.Signature`` shows its repr()."""

    def __repr__(self) -> str:
        return str(self)


_ELIDED = _Spelled("...")


def _signature(function: Callable[..., Any]) -> str:
    try:
        signature = inspect.signature(function, eval_str=True)
    except (NameError, TypeError, SyntaxError):  # an annotation that does not evaluate: spelled Any below
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            return "(*args: Any, **kwargs: Any) -> Any"
    except ValueError:  # a builtin without a signature
        return "(*args: Any, **kwargs: Any) -> Any"
    empty = inspect.Parameter.empty
    parameters = [parameter.replace(
        annotation=empty if parameter.annotation is empty else _Spelled(_spelled(parameter.annotation)),
        default=empty if parameter.default is empty else _ELIDED) for parameter in signature.parameters.values()]
    returns = signature.return_annotation
    return str(signature.replace(parameters=parameters,
                                 return_annotation=empty if returns is empty else _Spelled(_spelled(returns))))


def _spelled(annotation: Any) -> str:
    """``annotation`` as stub text, or ``Any`` for a type the glue code has no declaration of."""
    if annotation is None:
        return "None"
    if annotation is Any or isinstance(annotation, str):  # a string: a forward reference that did not resolve
        return "Any"
    if isinstance(annotation, type) and annotation in _BUILTINS:
        return _BUILTINS[annotation]
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _spelled(arguments[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_spelled(argument) for argument in arguments)
    if origin is Literal:
        if all(argument is None or type(argument) in (str, bytes, int, bool) for argument in arguments):
            return f"Literal[{', '.join(repr(argument) for argument in arguments)}]"
        return "Any"  # an enum member: the glue code has no enum to name it by
    if isinstance(origin, type) and origin in _BUILTINS and arguments:
        return f"{_BUILTINS[origin]}[{', '.join('...' if a is Ellipsis else _spelled(a) for a in arguments)}]"
    return "Any"
