"""What crosses a process boundary, typed: one home for each shape two processes share."""
