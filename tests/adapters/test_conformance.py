"""The behaviour every adapter owes the model, checked the same way for each (see ``cases.py``).

Each test drives a framework's real agent loop with a scripted model against
the real pool: the model sees one tool, ``run_python``, with Pynox's docstring
and one ``code`` parameter; denied paths come back as text with the hint and
the run goes on; a session keeps state; host functions are callable; and no
job or session process is left once the agent is done.
"""

from __future__ import annotations

import pytest

from pynox import Pool

from .cases import CASES, Case
from .procs import running_pools, wait_for_idle, wait_for_none
from .scripted import ANSWER, code_calls

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])]


def lookup(name: str) -> dict[str, object]:
    """Look up a product by name."""
    return {"name": name, "price": 12.5}


def test_the_model_sees_run_python_with_the_docstring_and_one_code_parameter(case: Case, pool: Pool) -> None:
    transcript = case.run(pool, code_calls("print('hello')"), allow_read=["/usr/share"], timeout="7s")
    assert [seen.name for seen in transcript.tools] == ["run_python"]
    seen = transcript.tool("run_python")
    docstring = pool.tool(allow_read=["/usr/share"], timeout="7s").__doc__ or ""
    body = docstring.split("\nArgs:\n")[0]
    # What the code may do is said once: in the description, or in the instructions (pydantic-ai's capability).
    told = seen.description + "\n" + (transcript.instructions or "")
    for line in filter(None, (line.strip() for line in body.splitlines())):
        assert line in told
    assert told.count("Read files: /usr/share") == 1 and told.count("7s of time") == 1
    assert set(seen.parameters["properties"]) == {"code"}
    assert seen.parameters["properties"]["code"]["type"] == "string"
    assert seen.parameters["properties"]["code"]["description"] == "Python source code to run, as a complete script."
    assert seen.parameters["required"] == ["code"]
    assert transcript.results == ["hello"] and transcript.answer == ANSWER


def test_a_denied_path_is_text_with_the_hint_and_the_run_goes_on(case: Case, pool: Pool) -> None:
    transcript = case.run(pool, code_calls("print(open('/etc/passwd').read())", "print('after')"))
    denied, after = transcript.results
    assert "PermissionError: [Errno 13] Permission denied: '/etc/passwd' (agent.py:1)" in denied
    assert 'Hint: /etc/passwd is outside the paths this sandbox may access' in denied
    assert 'allow_read=["/etc/passwd"]' in denied
    assert "root:" not in denied
    assert after == "after" and transcript.answer == ANSWER


def test_each_call_is_a_fresh_process_without_a_session(case: Case, pool: Pool) -> None:
    transcript = case.run(pool, code_calls("x = 41", "print(x + 1)"))
    assert transcript.results[1].startswith("NameError: name 'x' is not defined")


def test_a_session_keeps_state_between_calls(case: Case, pool: Pool) -> None:
    transcript = case.run(pool, code_calls("x = 41", "import math", "print(math.floor(x + 1.5))"), session=True)
    assert transcript.results == ["(The code ran without printing anything. Use print() to show results.)"] * 2 + [
        "42"]
    assert "Calls share one Python process" in transcript.tool("run_python").description


def test_a_host_function_is_listed_and_callable(case: Case, pool: Pool) -> None:
    code = "from pynox_host import lookup\nproduct = lookup('lamp')\nprint(product['name'], product['price'])"
    transcript = case.run(pool, code_calls(code, "from pynox_host import lookup\nlookup()"),
                          functions={"lookup": lookup})
    assert "- lookup(name: str) -> dict[str, object]: Look up a product by name." in \
        transcript.tool("run_python").description
    assert transcript.results[0] == "lamp 12.5"
    # Checked against the signature before the function runs, and said so to the model.
    assert "HostError" in transcript.results[1] and "missing a required argument: 'name'" in transcript.results[1]


def test_nothing_is_left_running_after_the_agent_finishes(case: Case, pool: Pool) -> None:
    others = running_pools()  # the module's pool, whose tool-long sessions live until it closes
    with Pool(workers=1) as own:
        wait_for_idle(templates=1, ignore=others)
        case.run(own, code_calls("import time\ntime.sleep(0.2)\nprint('slept')"))
        wait_for_idle(templates=1, ignore=others)
        transcript = case.run(own, code_calls("x = 1", "print(x)"), session=True)
        assert transcript.results[1] == "1"
        if case.session_ends_with_run:
            wait_for_idle(templates=1, ignore=others)
    wait_for_none(others)


def test_allow_hosts_reach_the_listed_host_and_no_other(case: Case, pool: Pool) -> None:
    """Every adapter passes allow_hosts on: the model is told which hosts it may reach, its code reaches the
    listed listener and is refused the other, which sees no connection."""
    import socket

    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    listed, other = (listener.getsockname()[1] for listener in listeners)
    code = (f"import socket\nfor port in ({listed}, {other}):\n    try:\n"
            "        socket.create_connection(('127.0.0.1', port), timeout=3).close(); print('reached', port)\n"
            "    except OSError as exc:\n        print('refused', port, type(exc).__name__)")
    try:
        transcript = case.run(pool, code_calls(code), allow_hosts=[f"127.0.0.1:{listed}"])
        told = transcript.tool("run_python").description + "\n" + (transcript.instructions or "")
        assert f"TCP connections to 127.0.0.1:{listed} only" in told
        assert f"reached {listed}" in transcript.results[0] and f"refused {other} PermissionError" in \
            transcript.results[0], transcript.results
        for listener, reached in zip(listeners, (True, False), strict=True):
            listener.settimeout(0.5)
            try:
                listener.accept()[0].close()
                assert reached, "the unlisted listener received a connection"
            except TimeoutError:
                assert not reached, "the listed listener received no connection"
    finally:
        for listener in listeners:
            listener.close()
