"""A session's saved state, the pool's half: the HMAC that vouches for it, its size cap, the save and restore steps.

A save is a step of the session that runs the pool's own code (job/session_state.py): it pickles ``__main__``
inside the confined process and writes the bytes on its stdout (wire/state.py). The pool reads that line as it
reads any of a job's output, bounded, decodes it once, and never unpickles it. It signs the bytes::

    state = MAGIC | HMAC-SHA256(key, MAGIC | data) | data

and the client keeps that. A restore is the opening step of a new session: the pool checks the size and the
HMAC (a state forged, changed, or saved by a pool with another key is refused before anything runs), then hands
the bytes to the new process, which unpickles them there, confined by the grants the restoring request brings.
The state carries no grant: what it may do is what the new session may do.

The HMAC is the pool's word that the bytes are what one of its sessions saved, so a state kept outside (a
checkpoint store, a client's database) cannot be swapped for other bytes. It does not make the bytes harmless:
a session's own code chose them. They are only ever read where that code could have run anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

import msgspec

from ..errors import ConfigError, RequestError
from ..protocol import SessionResult
from ..units import format_size
from ..wire.spec import ErrorInfo
from ..wire.state import MARK, RESTORE_CODE, SAVE_CODE, JobState, Skipped

__all__ = ["RESTORE_CODE", "SAVE_CODE", "StateKeeper"]

MAGIC = b"pynox-session-state-1\n"
_DIGEST = hashlib.sha256().digest_size
_HEADER = len(MAGIC) + _DIGEST
_LEAST_KEY = 32  # bytes: a key file shorter than SHA-256's own size weakens the HMAC
_MAX_KEY = 4096
_decoder = msgspec.json.Decoder(JobState)
# What the save's answer carries besides the state, so that it stays within one protocol line (the job
# chose all of it): the skipped names, each cut, and the save step's stderr. Its other output is dropped.
_MAX_SKIPPED = 50
_MAX_NAME = 100
_MAX_REASON = 200
_MAX_STDERR = 4096


def _load_key(path: str | None) -> bytes:
    if path is None:
        return os.urandom(_DIGEST)
    try:
        with open(path, "rb") as file:
            key = file.read(_MAX_KEY + 1)
    except OSError as exc:
        raise ConfigError(f"session_key_file: cannot read {path}: {exc.strerror}") from None
    if not _LEAST_KEY <= len(key) <= _MAX_KEY:
        raise ConfigError(f"session_key_file: {path} holds {len(key)} bytes; a key is {_LEAST_KEY} to {_MAX_KEY} "
                          "bytes (for example: head -c 32 /dev/urandom > FILE)")
    return key


class StateKeeper:
    """Signs what a save step wrote, and checks a state given back for a restore."""

    def __init__(self, key_file: str | None, max_size: int) -> None:
        self._key = _load_key(key_file)
        self.max_size = max_size

    @property
    def save_output(self) -> int:
        """The save step's output cap: the largest state as base64 in its JSON line, with room for the rest."""
        return (self.max_size + 2) // 3 * 4 + (64 << 10)

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self._key, MAGIC + data, hashlib.sha256).digest()

    def saved(self, result: SessionResult) -> SessionResult:
        """The save step's result as its answer: the state signed, or an error saying why there is none."""
        try:
            return self._saved(result)
        except Exception as exc:  # the save's answer, never the session's thread, pays for a fault here
            return self._failed(result, f"the pool could not take the state ({type(exc).__name__})")

    def _saved(self, result: SessionResult) -> SessionResult:
        if result.error is not None:
            return result  # the step failed (its process ended, it timed out, the pickler's import failed)
        lines = result.stdout.split("\n")
        found = [i for i, line in enumerate(lines) if line.startswith(MARK)]
        if result.stdout_truncated and (not found or found[-1] == len(lines) - 1):  # no whole line of a state
            return self._failed(result, f"the save step's output was cut at its cap before its state was whole: the "
                                        f"session's state is larger than this pool takes "
                                        f"({format_size(self.max_size)}, max_session_state), or the session's threads "
                                        f"printed past the cap")
        if not found:
            return self._failed(result, "the save step wrote no state")
        index = found[-1]
        try:
            state = _decoder.decode(lines[index][len(MARK):])
        except msgspec.DecodeError as exc:
            return self._failed(result, f"the save step wrote a state the pool cannot read ({exc})")
        size = _HEADER + len(state.data)
        if size > self.max_size:
            return self._failed(result, f"the session's state is {format_size(size)}, larger than this pool takes "
                                        f"({format_size(self.max_size)}, max_session_state)")
        signed = MAGIC + self._mac(state.data) + state.data
        skipped = [Skipped(name=item.name[:_MAX_NAME], reason=item.reason[:_MAX_REASON])
                   for item in state.skipped[:_MAX_SKIPPED]]
        if len(state.skipped) > _MAX_SKIPPED:
            skipped.append(Skipped(name="*", reason=f"and {len(state.skipped) - _MAX_SKIPPED} more left out"))
        return msgspec.structs.replace(result, stdout="", stderr=result.stderr[:_MAX_STDERR],
                                       images=msgspec.UNSET, images_dropped=msgspec.UNSET, outputs=msgspec.UNSET,
                                       state=base64.b64encode(signed).decode(), skipped=skipped)

    @staticmethod
    def _failed(result: SessionResult, message: str) -> SessionResult:
        return msgspec.structs.replace(result, error=ErrorInfo(type="SessionStateError", message=message))

    def opened(self, state: str) -> bytes:
        """The pickled variables of a state given for a restore; RequestError if it is not one this pool saved."""
        if len(state) > (self.max_size + 2) // 3 * 4:
            raise RequestError(f"restore: the state is larger than this pool takes ({format_size(self.max_size)}, "
                               "max_session_state)")
        try:
            signed = base64.b64decode(state, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("restore: the state is not base64") from None
        if len(signed) < _HEADER or not signed.startswith(MAGIC):
            raise RequestError("restore: this is not a Pynox session state (a save's state starts with its own "
                               "header)")
        mac, data = signed[len(MAGIC):_HEADER], signed[_HEADER:]
        if not hmac.compare_digest(mac, self._mac(data)):
            raise RequestError("restore: the state's HMAC does not match this pool's key: it was saved by a pool "
                               "with another key (set the same session_key_file on both), or changed since")
        return data
