#!/bin/sh
# A client of `pynox pool` in plain POSIX shell: any language that can write and read lines can do this.
#
# Each request is one JSON object on one line; each answer is one JSON object on one line: first the
# ready event, then one result per request, in the order the jobs finish. EOF on the pool's stdin makes it
# finish the accepted jobs and exit 0 (each result's "exit" says how its job went).
#
# Usage: sh examples/jsonl_client.sh     (PYNOX names the command if `pynox` is not on PATH)
set -eu
PYNOX=${PYNOX:-pynox}

printf '%s\n' \
    '{"id": "hello", "code": "print(\"hello from the sandbox\")"}' \
    '{"id": "sum", "code": "import sys\nprint(sum(map(int, sys.argv[1:])))", "args": ["1", "2", "3"]}' \
    '{"id": "denied", "code": "print(open(\"/etc/passwd\").read())"}' |
    $PYNOX pool --workers=2
