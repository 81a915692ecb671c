"""The supervisor settings of docs/reliability.md, checked against the shutdown contract and played.

Each example is read from the page itself. Its settings must fit the contract (a stop signal the pool
drains on, a delivery that reaches it, a timeout longer than the drain deadline plus the escalation);
then its stop sequence is played against a real pool started with the example's own command line: the
stop signal as that supervisor delivers it, and the kill it sends when its timeout passes. The pool must
exit on its own before that kill, with every accepted job answered.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
import shlex
import signal
import time
from pathlib import Path

import pytest

from pynox.cli import build_parser
from pynox.units import parse_duration

from .pool_driver import DEADLINE, PoolProcess, descendants, jobs_of, refused

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
_FENCE = re.compile(r"<!-- run-by: tests/pool/test_pool_supervisors.py -->\n```(\w+)\n(.*?)^```", re.M | re.S)
ESCALATION = 5.0  # seconds the pool may need after its drain deadline to stop what is left and exit
DRAIN_CUT = 75


def _blocks(lang: str) -> list[str]:
    return [body for found, body in _FENCE.findall(GUIDE.read_text(encoding="utf-8")) if found == lang]


def _ini(marker: str) -> configparser.ConfigParser:
    (body,) = [b for b in _blocks("ini") if marker in b]
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(body)
    return parser


def _pool_args(command: str) -> tuple[list[str], float]:
    """The pool's own arguments in a command line, and the drain deadline they give."""
    words = shlex.split(command)
    assert words[0].endswith("pynox") and words[1] == "pool", words
    args = build_parser().parse_args(words[1:])
    drain = parse_duration(args.drain_timeout, "--drain-timeout") if args.drain_timeout else 25.0
    return words[2:], drain


def _play_stop(args: list[str], *, delivery: str, stop_timeout: float) -> None:
    """Jobs longer than the drain, one queued; the stop signal as the supervisor sends it; the pool must be
    gone before the supervisor's kill, every job answered."""
    with PoolProcess(*args, start_new_session=True) as pool:
        running = [pool.submit(code="import time\ntime.sleep(120)", timeout="300s") for _ in range(2)]
        queued = pool.submit(code="print('queued')")
        pool.stats()
        end = time.monotonic() + DEADLINE
        while len(jobs_of(pool.pid)) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        if delivery == "group":
            os.killpg(pool.pid, signal.SIGTERM)
        else:
            for pid in [pool.pid, *descendants(pool.pid)] if delivery == "cgroup" else [pool.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                    os.kill(pid, signal.SIGCONT)  # systemd follows its stop signal with SIGCONT
        status = pool.wait_exit(timeout=stop_timeout)  # else the supervisor's SIGKILL would have come
        for request_id in running:
            assert pool.result(request_id)["error"]["type"] == "CancelledError"
        refused(pool.result(queued), "shutting down")
        assert status == DRAIN_CUT


def test_the_systemd_unit_fits_the_contract_and_its_stop_is_answered() -> None:
    socket_unit = _ini("ListenStream")
    assert socket_unit["Socket"]["Accept"] == "yes"  # one pool per connection, on its stdin and stdout
    service = _ini("ExecStart")["Service"]
    assert service["StandardInput"] == "socket" and service["StandardOutput"] == "socket"
    assert service.get("KillMode", "control-group") in ("control-group", "mixed")
    assert service.get("KillSignal", "SIGTERM") in ("SIGTERM", "SIGINT")
    assert service.get("SendSIGHUP", "no") in ("no", "yes")  # SIGHUP is ignored either way
    assert "ExecReload" not in service  # nothing to reload
    args, drain = _pool_args(service["ExecStart"])
    stop_timeout = parse_duration(service["TimeoutStopSec"], "TimeoutStopSec")
    assert stop_timeout >= drain + ESCALATION, (stop_timeout, drain)
    _play_stop(args, delivery="cgroup" if service.get("KillMode", "control-group") == "control-group" else "pid",
               stop_timeout=stop_timeout)


def test_the_supervisord_program_fits_the_contract_and_its_stop_is_answered() -> None:
    program = _ini("[program:")["program:pynox"]
    assert program["stopsignal"] in ("TERM", "INT")
    assert program["stopasgroup"] == "true" and program["killasgroup"] == "true"
    args, drain = _pool_args(program["command"])
    stop_timeout = float(program["stopwaitsecs"])
    assert stop_timeout >= drain + ESCALATION, (stop_timeout, drain)
    # stopasgroup: the signal goes to the process group, which holds the templates too.
    _play_stop(args, delivery="group", stop_timeout=stop_timeout)


@pytest.mark.pure
def test_the_kubernetes_grace_period_fits_the_drain() -> None:
    (body,) = _blocks("yaml")
    grace = float(re.search(r"terminationGracePeriodSeconds:\s*(\d+)", body).group(1))  # type: ignore[union-attr]
    command = re.search(r"command:\s*\[(.*)\]", body).group(1)  # type: ignore[union-attr]
    words = [w.strip().strip('"') for w in command.split(",")]
    _, drain = _pool_args(shlex.join(words))
    assert grace >= drain + ESCALATION, (grace, drain)
