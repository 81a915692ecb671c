"""Which of the sandbox's calls reach the agent's tools: one state machine per executor, moved by its steps.

::

    OVER ──step begins──▶ OPEN ──final_answer begins──▶ ANSWERING
     ▲ ▲                  │  ▲                             │
     │ │      step ends   │  └──its checks refused it──────┤
     │ └──────────────────┘                                │ step ends
     │                                                     ▼
     └──────────────its checks refused it───────────── ANSWERED ──step begins──▶ OPEN

``OPEN``: a step runs; its calls reach the tools. ``ANSWERING``: the agent's
``final_answer`` tool was called, and every later call is refused: smolagents'
own executor stops at the first final answer, and code that catches the
exception that ends the step (or calls from another thread) must reach no tool.
If the tool's checks refuse the answer, the step goes on and may answer again.
``OVER``: no step runs: a call now comes from a thread a step left behind, and
is refused. ``ANSWERED``: the step that gave a final answer is over; a call
still says why it is refused. A final answer refused once its step is over
(``OPEN`` or ``OVER``: a tool that outlived its step) moves nothing.

The moves are a table, each checked, under one condition that also counts the
calls in flight, so that a step can wait for them before it returns.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator

import pynox

__all__ = ["CallGate", "Gate"]


class Gate(enum.Enum):
    OVER = "over"
    OPEN = "open"
    ANSWERING = "answering"
    ANSWERED = "answered"


class _Event(enum.Enum):
    STEP_BEGINS = "step begins"
    FINAL_ANSWER = "final_answer begins"
    ANSWER_REFUSED = "its checks refused the answer"
    STEP_ENDS = "step ends"


_MOVES: dict[tuple[Gate, _Event], Gate] = {
    (Gate.OVER, _Event.STEP_BEGINS): Gate.OPEN,
    (Gate.ANSWERED, _Event.STEP_BEGINS): Gate.OPEN,
    (Gate.OPEN, _Event.FINAL_ANSWER): Gate.ANSWERING,
    (Gate.ANSWERING, _Event.ANSWER_REFUSED): Gate.OPEN,
    (Gate.ANSWERED, _Event.ANSWER_REFUSED): Gate.OVER,
    # A final answer of an earlier step, whose tool outlived it, refused now: it shut nothing out.
    (Gate.OPEN, _Event.ANSWER_REFUSED): Gate.OPEN,
    (Gate.OVER, _Event.ANSWER_REFUSED): Gate.OVER,
    (Gate.OPEN, _Event.STEP_ENDS): Gate.OVER,
    (Gate.ANSWERING, _Event.STEP_ENDS): Gate.ANSWERED,
}


class CallGate:
    """One executor's gate, and its calls in flight."""

    def __init__(self) -> None:
        self._calls = threading.Condition()
        self._gate = Gate.OVER
        self._in_flight = 0

    @property
    def state(self) -> Gate:
        with self._calls:
            return self._gate

    @property
    def in_flight(self) -> int:
        with self._calls:
            return self._in_flight

    def _move(self, event: _Event) -> None:
        """Under ``_calls``."""
        after = _MOVES.get((self._gate, event))
        if after is None:
            raise RuntimeError(f"PynoxExecutor lost track of its step's calls ({self._gate.value}: {event.value})")
        self._gate = after

    def _refuse(self, name: str) -> None:
        """Under ``_calls``: ``HostError`` unless a step runs that gave no final answer."""
        if self._gate in (Gate.ANSWERING, Gate.ANSWERED):
            raise pynox.HostError(f"{name}(): this step already gave its final answer; nothing more runs")
        if self._gate is Gate.OVER:
            raise pynox.HostError(f"{name}(): the step that started this thread is over; nothing more runs")

    def begin_step(self) -> None:
        with self._calls:
            self._move(_Event.STEP_BEGINS)

    def check(self, name: str) -> None:
        """Refuse the call now if it would be refused, before anything it sent is read."""
        with self._calls:
            self._refuse(name)

    @contextlib.contextmanager
    def admitted(self, name: str) -> Iterator[None]:
        """Hold the gate while the caller records what the call brought: refused, nothing is recorded."""
        with self._calls:
            self._refuse(name)
            yield

    def enter(self, name: str, *, answers: bool) -> None:
        """A call reaches its tool (``answers``: the agent's ``final_answer``, which shuts every later call
        out); ``HostError`` if it may not."""
        with self._calls:
            self._refuse(name)
            if answers:
                self._move(_Event.FINAL_ANSWER)
            self._in_flight += 1

    def leave(self, *, refused_answer: bool) -> None:
        """The call's tool returned (``refused_answer``: ``final_answer`` raised, so the step may answer again)."""
        with self._calls:
            if refused_answer:
                self._move(_Event.ANSWER_REFUSED)
            self._in_flight -= 1
            self._calls.notify_all()

    def end_step(self, timeout: float) -> bool:
        """The step's process is gone: refuse its threads' further calls, and wait up to ``timeout`` for those
        in flight; False if some still run."""
        with self._calls:
            self._move(_Event.STEP_ENDS)
            return self._calls.wait_for(lambda: self._in_flight == 0, timeout=timeout)
