"""Host functions, as the host sees them: what the model is shown, and how a job's call is checked and answered.

A host function runs in the application's own process, with the
application's powers: it is the one place where sandboxed code reaches
outside. So a call from a job is treated as a tool call from a model:

* **Its signature is the contract.** Arguments are bound to the parameters
  and converted strictly against their annotations (``msgspec``: no ``"9"``
  for an ``int``, no ``True`` for an ``int``, no ``dict`` for a ``str``, no
  integer beyond 64 bits) before the function runs; a mismatch is a
  ``HostError`` in the job naming the parameter. Keywords bound with
  ``functools.partial`` are the host's: the job cannot pass them, and the
  model never sees them.
* **Its result is plain JSON** of at most 1 MB (``wire/host_values.py``),
  or the job gets a ``HostError`` saying why.
* **Its exception text is the host's to reveal.** By default the job learns
  only the exception's type: exception messages carry connection strings,
  tokens in URLs, file paths, exactly what host functions keep from the
  sandbox. The full traceback is logged at WARNING. A
  :class:`~pynox.errors.HostError` raised on purpose passes its message;
  ``host_errors="full"`` passes every message (the application's choice).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from ..errors import HostError, RequestError
from ..wire.host_channel import MAX_PAYLOAD
from ..wire.host_values import NotPlainJSON, check_plain_json

__all__ = ["HostErrors", "HostLoop", "answer_call", "awaiting_on", "step_functions", "visible_signature"]

HostErrors = Literal["safe", "full"]
HostFunction = Callable[..., Any]


class HostLoop:
    """An event loop on a thread of its own, for the async host functions of runs made without one (``run``
    from a thread): started on first use."""

    def __init__(self, thread_name: str = "pynox-host-loop") -> None:
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._run, args=(self._loop,), name=self._thread_name, daemon=True).start()
            return self._loop

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        finally:
            loop.close()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def awaiting_on(loop: asyncio.AbstractEventLoop | Callable[[], asyncio.AbstractEventLoop]) -> Callable[[Any], Any]:
    """The ``run_awaitable`` of :func:`answer_call`: await on ``loop`` (a loop, or what gives one when first
    needed: a run's own loop, else a :class:`HostLoop`'s), from this thread, and block here for the value."""

    def run_awaitable(awaitable: Any) -> Any:
        async def wait() -> Any:
            try:
                return await awaitable
            except (KeyboardInterrupt, SystemExit) as exc:  # asyncio would stop the loop for them
                raise _Escaped(exc) from None

        target = loop if isinstance(loop, asyncio.AbstractEventLoop) else loop()
        try:
            return asyncio.run_coroutine_threadsafe(wait(), target).result()
        except _Escaped as escaped:
            raise escaped.exc from None

    return run_awaitable


class _Escaped(Exception):
    """A KeyboardInterrupt or SystemExit an async host function raised, carried past the event loop to the thread
    that answers the call, as a plain exception: raised through the loop, it would stop the loop (the pool's own,
    or the caller's), leaving this call and every later one on it unanswered."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc


def step_functions(fixed: Mapping[str, HostFunction], given: Mapping[str, HostFunction] | None
                   ) -> Mapping[str, HostFunction]:
    """The callables of one session step: the session's (``fixed``), or others under the same names (a
    framework's context bound for this call, say); the names were fixed when the session started."""
    if given is None:
        return fixed
    unknown = sorted(set(given) - set(fixed))
    if unknown:
        raise RequestError(f"a session's host functions are fixed when it starts; not among them: "
                           f"{', '.join(unknown)}")
    return {**fixed, **given}
_MAX_MESSAGE = 10_000  # characters of an error message sent to the job
_log = logging.getLogger(__name__)


def _layers(function: HostFunction) -> list[HostFunction]:
    """The function, and every partial or ``functools.wraps`` wrapper's inner function, outermost first:
    the same chain :func:`inspect.signature` follows."""
    layers, seen = [function], {id(function)}
    while True:
        inner = layers[-1].func if isinstance(layers[-1], functools.partial) else getattr(layers[-1], "__wrapped__",
                                                                                           None)
        if inner is None or id(inner) in seen:
            return layers
        seen.add(id(inner))
        layers.append(inner)


def _bound_keywords(function: HostFunction) -> set[str]:
    return {key for layer in _layers(function) if isinstance(layer, functools.partial) for key in layer.keywords}


def _underlying(function: HostFunction) -> HostFunction:
    return _layers(function)[-1]


def visible_signature(function: HostFunction) -> inspect.Signature:
    """The signature a job may call: without the keywords a ``functools.partial`` fixed."""
    try:
        signature = inspect.signature(function, eval_str=True)
    except (NameError, TypeError, SyntaxError):  # an annotation that does not evaluate: show it as written
        signature = inspect.signature(function)
    hidden = _bound_keywords(function)
    return signature.replace(parameters=[p for p in signature.parameters.values() if p.name not in hidden])


def _annotations(function: HostFunction) -> dict[str, Any]:
    try:
        return typing.get_type_hints(_underlying(function))
    except Exception:  # a forward reference that does not resolve: bind by name, convert nothing
        return {}


def _convert(name: str, parameter: inspect.Parameter, value: Any, annotation: Any) -> Any:
    if annotation is Any or annotation is inspect.Parameter.empty:
        return value
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        return tuple(_convert(name, parameter.replace(kind=inspect.Parameter.POSITIONAL_ONLY), item, annotation)
                     for item in value)
    if parameter.kind is inspect.Parameter.VAR_KEYWORD:
        plain = parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        return {key: _convert(name, plain, item, annotation) for key, item in value.items()}
    try:
        return msgspec.convert(value, annotation, strict=True)
    except msgspec.ValidationError as exc:
        raise HostError(f"{name}(): argument {parameter.name!r}: {exc}") from None
    except (TypeError, ValueError):  # a type msgspec cannot check (a protocol, a custom class): pass it on
        return value


def _prepare(name: str, function: HostFunction, args: list[Any], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    fixed = sorted(_bound_keywords(function) & kwargs.keys())
    if fixed:
        raise HostError(f"{name}(): {', '.join(fixed)} is fixed by the host and cannot be passed")
    signature = visible_signature(function)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise HostError(f"{name}(): {exc}") from None
    hints = _annotations(function)
    for parameter_name, value in bound.arguments.items():
        parameter = signature.parameters[parameter_name]
        annotation = hints.get(parameter_name, parameter.annotation)
        bound.arguments[parameter_name] = _convert(name, parameter, value, annotation)
    return bound


def _shown(message: str) -> str:
    """The text of an error as the job gets it: cut, and a lone surrogate (a file name that is not UTF-8, as
    ``os.fsdecode`` gives it) written as its escape, which JSON can carry."""
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + f"... ({len(message) - _MAX_MESSAGE} more characters)"
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def _text(exc: BaseException) -> str:
    """``str(exc)``: the exception's class is the host function's, and its ``__str__`` may fail too."""
    try:
        return str(exc)
    except BaseException:
        return "<exception str() failed>"  # what Python's own traceback prints then


def answer_call(name: str, function: HostFunction | None, args: list[Any], kwargs: dict[str, Any], *,
                host_errors: HostErrors = "safe",
                run_awaitable: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Check and run one call; the reply's ``result`` or ``error``. Never raises.

    An ``async def`` function's coroutine (any awaitable it returns) is run to its end by
    ``run_awaitable`` (on an event loop; see the client)."""
    if function is None:
        return {"error": f"no host function {name!r} is registered for this run"}
    try:
        bound = _prepare(name, function, args, kwargs)
        value = function(*bound.args, **bound.kwargs)
        if inspect.isawaitable(value):
            if run_awaitable is None:
                raise HostError(f"{name}() is async, and nothing here runs an event loop for it")
            value = run_awaitable(value)
    except HostError as exc:  # raised on purpose (or by the checks above): its text is meant for the job
        return {"error": _shown(_text(exc))}
    except BaseException as exc:  # SystemExit too (argparse in a tool): without a reply the job would hang
        _log.warning("host function %s() raised %s", name, type(exc).__name__, exc_info=exc)
        if host_errors == "full":
            return {"error": _shown(f"{type(exc).__name__}: {_text(exc)}")}
        return {"error": f"{name}() failed ({type(exc).__name__}); the host logged the details"}
    try:
        check_plain_json(value, "result")
        size = len(msgspec.json.encode(value))
    except NotPlainJSON as exc:
        return {"error": f"{name}() returned a value that is not plain JSON: {exc}"}
    if size > MAX_PAYLOAD:
        return {"error": f"{name}() returned {size} bytes of JSON, more than the 1 MB limit"}
    return {"result": value}
