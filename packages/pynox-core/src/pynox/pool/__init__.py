"""The pool: server, templates and the confined child."""
