"""With ``--log=json``, every line the pool writes on stderr is JSON: its own Python logging, uncaught
exceptions and warnings included, as :class:`~pynox.protocol.PoolLogEvent` lines (``event: "log"``)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType

from ..protocol import PoolLogEvent, encode

__all__ = ["log_records_as_json", "relay_as_json"]


class _JsonLines(logging.Handler):
    def __init__(self, write: Callable[[bytes], None]) -> None:
        super().__init__()
        self._write = write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            self._write(encode(PoolLogEvent(ts_ms=int(record.created * 1000), event="log", message=message,
                                            level=record.levelname)))
        except Exception:  # a log line must never cost the pool its work
            self.handleError(record)


def log_records_as_json(write: Callable[[bytes], None]) -> None:
    """Send every record of this process's logging, every uncaught exception and every warning to
    ``write`` as a JSON line."""
    root = logging.getLogger()
    root.addHandler(_JsonLines(write))
    logging.captureWarnings(True)
    log = logging.getLogger("pynox.pool")

    def uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        log.error("uncaught %s", kind.__name__, exc_info=(kind, value, tb))

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        thread = args.thread.name if args.thread is not None else "?"
        log.error("uncaught %s in thread %s", args.exc_type.__name__, thread,
                  exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback))

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread


def relay_as_json(write: Callable[[bytes], None], source: str) -> int:
    """A descriptor whose lines reach ``write`` as JSON log lines (``level`` WARNING: a template has
    nothing to say on stderr unless something is wrong, such as a preload that prints); the caller keeps it
    open and hands it to its templates as their stderr."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)

    def relay() -> None:
        with open(read_end, "rb") as lines:
            for raw in lines:
                text = raw.decode("utf-8", "replace").rstrip("\n")
                if text:
                    write(encode(PoolLogEvent(ts_ms=int(time.time() * 1000), event="log", level="WARNING",
                                              message=f"{source}: {text}")))

    threading.Thread(target=relay, name="pynox-template-stderr", daemon=True).start()
    return write_end
