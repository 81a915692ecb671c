"""The tests' one harness: what every suite needs, borrowed rather than written again.

- ``procfs``: the one reader of a process's ``/proc`` facts (no test file outside the harness opens ``/proc``;
  ``tests/test_layout.py`` holds the rule).
- ``tests/pool/pool_driver.py``: the one pool driver (JSON Lines over a pool's pipes, timeouts scaled for slow
  machines) and the leftover guard (processes below a subreaper, descriptors, cgroups); it stays at its
  path, which every suite already imports.
- ``fixtures``: the one factory for the pools and sessions a module shares.
- ``fd_audit``: a pool run under a descriptor audit (a ``sitecustomize`` on its PYTHONPATH) that reports every
  close of a number its closer no longer owns, with the stacks of both owners.
- ``pool_bugs``: a bug planted in one of a real pool's own steps (a ``sitecustomize`` on its PYTHONPATH), to test
  the guard around those steps.
- ``scrape`` and ``clients``: a pool's metrics read as a scraper reads them; a killed client's teardown.
- ``tests/sandbox/harness.py``: the sandbox suite's harness (a world outside, each case's control).

The sandbox rule holds here too: ``procfs`` and the leftover guard judge the product from outside and never
import the product's code.
"""
