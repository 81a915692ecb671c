"""The pool server: the trusted process that takes requests and gives every result."""
