"""Saving and restoring a session's ``__main__``, inside the confined process (the pool's save/restore steps).

cloudpickle serializes the variables: functions, lambdas and classes defined in the session's code are saved
by value (plain pickle would save them by a name the next process does not have), everything importable by
reference (a module is saved as its name and imported again on restore). A variable that cannot be pickled (an
open file, a socket, a generator, a lock) is skipped with the pickler's reason and the rest is saved.

Everything here runs next to the user's code, which may have changed any of it: the pool trusts none of what
this writes (server/session_state.py), and a restore unpickles only here, in a process as confined as any step.
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import msgspec

from ..wire.state import MARK, JobState, Skipped

__all__ = ["restore", "save"]

_MAX_REASON = 300  # characters of a pickler's message kept as a skip's reason


def _variables() -> dict[str, object]:
    namespace = sys.modules["__main__"].__dict__
    # Dunder names are the module's own machinery (__builtins__, __file__, ...), made again by every process.
    # pynox_host and its functions are the session's grants: the restoring session is given its own.
    host = [module for module in (sys.modules.get("pynox_host"), sys.modules.get("pynox_host.aio")) if module]
    granted = {id(value) for module in host for value in (module, *vars(module).values())
               if callable(value) or isinstance(value, types.ModuleType)}  # not its strings: a user's may be equal
    return {name: value for name, value in namespace.items()
            if not (name.startswith("__") and name.endswith("__")) and id(value) not in granted}


def save() -> None:
    import cloudpickle  # type: ignore[import-untyped]  # imported only by a save: no cost to any other job

    variables = _variables()
    with _quiet():
        data, skipped = _pickled(variables, cloudpickle)
    line = MARK + msgspec.json.encode(JobState(data=data, skipped=skipped)).decode() + "\n"
    encoded = line.encode()
    view = memoryview(encoded)
    while view:  # one line on the step's stdout, whole, past any buffering of sys.stdout
        written = os.write(1, view)
        view = view[written:]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """What the session's objects print while they are pickled (a ``__reduce__`` of its own) goes nowhere: the pool
    drops a save step's other output anyway, and output past its cap cost the state its line (the pool then said
    the state was too large)."""
    sys.stdout.flush()
    kept = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()  # what it left in the buffer, to /dev/null too
        except Exception:  # the session's code may have replaced or closed its stdout
            pass
        os.dup2(kept, 1)
        os.close(kept)


def _pickled(variables: dict[str, object], cloudpickle: Any) -> tuple[bytes, list[Skipped]]:
    skipped: list[Skipped] = []
    try:
        # All together first: variables that share an object still share it after a restore.
        data = cloudpickle.dumps(variables, protocol=5)
    except Exception:
        kept: dict[str, object] = {}
        for name, value in variables.items():
            try:
                cloudpickle.dumps(value, protocol=5)
            except Exception as exc:
                skipped.append(Skipped(name=_text(name), reason=_text(f"{type(exc).__name__}: {exc}"[:_MAX_REASON])))
            else:
                kept[name] = value
        data = cloudpickle.dumps(kept, protocol=5)
    return data, skipped


def _text(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (a name set through globals(), a value quoted in a message)
    as its escape, so that it cannot cost the whole save its line."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def restore() -> None:
    import pickle

    state = base64.b64decode(sys.argv[1])
    del sys.argv[1:]
    variables = pickle.loads(state)  # cloudpickle's output is plain pickle: it needs cloudpickle only to exist
    if not isinstance(variables, dict):
        raise TypeError(f"a session's state is a dict of its variables, not {type(variables).__name__}")
    sys.modules["__main__"].__dict__.update(variables)
