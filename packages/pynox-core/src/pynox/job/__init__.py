"""The job child: everything that runs after confinement, attacker-controlled from its first instruction."""
