"""Pynox for pydantic-ai: not yet built; the package exists so the workspace is whole."""

__all__: list[str] = []
