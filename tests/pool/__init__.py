"""Conformance suite of `pynox pool`: the real process over pipes (issues 3 and 4)."""
