"""Soak: thousands of misbehaving jobs through one real pool, nothing lost, nothing leaked (issue 8)."""
