"""The job child: everything that runs after confinement, attacker-controlled from its first instruction.

Forked from the template, a child confines itself (:mod:`.setup`: the fail-closed steps, in order),
runs the job's code as ``__main__`` (:mod:`.execute`) and writes one report (:mod:`.report`);
:mod:`.child` strings those together for a child forked for its job and for one prepared ahead. The
job's code reaches the pool only through :mod:`.pynox_host` (its host functions), and its figures
through :mod:`.figures` (the matplotlib backend). The pool believes none of it beyond what it checks
(see pynox/server/report.py): it imports only the shared shapes (:mod:`pynox.wire`), the policy and
the hints, and nothing here is imported by the server or the client.
"""
