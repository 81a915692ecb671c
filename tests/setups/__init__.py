"""Outer setups the suites run under in CI: environments a user runs Pynox in, reproduced on this machine."""
