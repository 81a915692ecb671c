"""Pynox for strands: not yet built; the package exists so the workspace is whole."""

__all__: list[str] = []
