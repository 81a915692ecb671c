"""The client passes the pool's ``--log=json`` lines on as records of ``pynox.pool``: each line's message
as the record's message, its decoded fields as the record's ``pynox`` attribute, never JSON text."""

from __future__ import annotations

import logging
import time

import pytest

from pynox import Pool


def test_the_pools_json_lines_become_records_with_their_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="pynox.pool")
    with Pool(1, log="json") as pool:
        result = pool.run("raise ValueError('boom')")
        assert result.error is not None
        end = time.monotonic() + 10
        while time.monotonic() < end and not any(getattr(r, "pynox", {}).get("error") == "ValueError"
                                                 for r in caplog.records):
            time.sleep(0.05)
    records = [r for r in caplog.records if r.name == "pynox.pool"]
    assert records, caplog.text
    for record in records:
        assert not record.getMessage().lstrip().startswith("{"), record.getMessage()  # decoded, not re-logged
        assert isinstance(record.pynox, dict), record  # type: ignore[attr-defined]
    (job,) = [r for r in records if r.pynox.get("error") == "ValueError"]  # type: ignore[attr-defined]
    assert job.levelno == logging.DEBUG and job.pynox["exit"] == 1  # type: ignore[attr-defined]
    ready = [r for r in records if r.pynox.get("event") == "ready"]  # type: ignore[attr-defined]
    assert ready and ready[0].levelno == logging.INFO and "ready" in ready[0].getMessage()
