"""OpenTelemetry spans: one per request the pool answers with a result, when the operator asks for them.

The operator asks with OpenTelemetry's own variable, ``OTEL_TRACES_EXPORTER`` in the pool's environment:
``console`` (one JSON line per span on the pool's stderr: its stdout is the protocol's) or ``otlp`` (where an
OTLP exporter package is installed; ``OTEL_EXPORTER_OTLP_*`` say where to). ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` apply as usual; the service is ``pynox`` unless they name one. Unset, ``none``,
or without ``opentelemetry-sdk`` importable: nothing is imported and nothing is kept, so a pool that does not
trace pays one ``if`` per request.

A request's span, ``pynox.job`` (a session's step: ``pynox.session.step``), is a child of the ``traceparent``
the request carried (a root span without one): from the moment the pool read the line to its result, with
the wait for a worker as an event, and the labels an operator filters by: the id, tenant, profile, session
and step, the exit status and error type. Never the code, its arguments or its output. Jobs' processes know
nothing of it: a span is the pool's record of what it did, made from what the pool itself knows.

Not ``opentelemetry-instrument``: its console exporter would write on the pool's stdout, the protocol.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..protocol import RequestId, Result

__all__ = ["Spans", "spans_from_environment"]

_VARIABLE = "OTEL_TRACES_EXPORTER"


def _key(request_id: RequestId) -> tuple[str, object]:
    return type(request_id).__name__, request_id  # 1, 1.0 and "1" are three ids


class Spans:
    """The arrival of each request not answered yet, and the tracer its span is made with at its result."""

    def __init__(self, tracer: Any, shutdown: Callable[[], None]) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self._shutdown = shutdown
        self._propagator = TraceContextTextMapPropagator()
        self._kind, self._status, self._error = SpanKind.SERVER, Status, StatusCode.ERROR
        self._lock = threading.Lock()
        self._by_id: dict[tuple[str, object], list[tuple[int, str | None]]] = {}

    def arrived(self, request_id: RequestId, traceparent: str | None, arrived_ns: int) -> None:
        """A request that will be answered by a result, read at ``arrived_ns`` (the monotonic clock)."""
        wall = time.time_ns() - (time.monotonic_ns() - arrived_ns)
        with self._lock:
            self._by_id.setdefault(_key(request_id), []).append((wall, traceparent))

    def finished(self, result: Result, *, session: str | None, step: int | None, tenant: str, profile: str) -> None:
        end = time.time_ns()
        with self._lock:
            waiting = self._by_id.get(_key(result.id))
            start, traceparent = waiting.pop(0) if waiting else (end, None)
            if waiting is not None and not waiting:
                del self._by_id[_key(result.id)]
        parent = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        attributes: dict[str, str | int] = {"pynox.id": str(result.id), "pynox.tenant": tenant,
                                            "pynox.exit": result.exit, "pynox.queue_us": result.queue_us,
                                            "pynox.duration_us": result.duration_us}
        if profile:
            attributes["pynox.profile"] = profile
        if session is not None:
            attributes["pynox.session"] = session
        if step is not None:
            attributes["pynox.step"] = step
        if result.error is not None:
            attributes["error.type"] = result.error.type
        span = self._tracer.start_span("pynox.session.step" if session is not None else "pynox.job", context=parent,
                                       kind=self._kind, start_time=start, attributes=attributes)
        if result.queue_us and not result.refused:
            span.add_event("started", timestamp=min(start + result.queue_us * 1000, end))
        if result.error is not None:
            span.set_status(self._status(self._error, result.error.type))
        span.end(end_time=end)

    def close(self) -> None:
        """Export what is left (an OTLP batch), at the pool's end."""
        self._shutdown()


def spans_from_environment(warn: Callable[[str], None]) -> Spans | None:
    """Spans as ``OTEL_TRACES_EXPORTER`` asks, or None (not asked, or not possible here: ``warn`` says why)."""
    exporter_name = os.environ.get(_VARIABLE, "").strip().lower()
    if exporter_name in ("", "none"):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        warn(f"{_VARIABLE}={exporter_name} asks for spans, but opentelemetry-sdk is not installed: no spans")
        return None
    if exporter_name == "console":
        def one_line(span: ReadableSpan) -> str:
            return str(span.to_json(indent=None)) + "\n"

        processor: Any = SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr, formatter=one_line))
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError:
            warn(f"{_VARIABLE}=otlp: no OTLP exporter is installed (opentelemetry-exporter-otlp-proto-http): "
                 "no spans")
            return None
        processor = BatchSpanProcessor(OTLPSpanExporter())
    else:
        warn(f"{_VARIABLE}={exporter_name}: the pool makes spans for console or otlp only: no spans")
        return None
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "pynox"}))
    provider.add_span_processor(processor)
    from .. import __version__

    return Spans(provider.get_tracer("pynox", __version__), provider.shutdown)
