"""Fault injection: kills from outside, a full disk, a vanishing or stalled client, failing host handlers (issue 8)."""
