"""Bad input: property-based fuzzing of request and reply lines against the real pool process (issue 8)."""
