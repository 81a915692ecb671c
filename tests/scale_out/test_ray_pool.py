"""RayPool on a real two-node Ray cluster (see conftest.py): real node pools, real jobs, no stand-ins.

Each claim is checked against what a local ``pynox.Pool`` does for the same request, so a difference the
cluster introduces (a field lost on the way, an error changed, a limit not applied) fails here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import pynox
from pynox import ConfigError, HostError, PoolError, RequestError
from pynox_ray import RayPool

# Fields that measure the run rather than describe it: they differ between any two runs.
_MEASURED = {"id", "duration_ms", "duration_us", "queue_us"}
_MEASURED_USAGE = {"cpu_ms", "max_rss_kb", "memory_peak_kb"}


def _described(result: pynox.Result) -> dict[str, Any]:
    fields = {key: value for key, value in dataclasses.asdict(result).items() if key not in _MEASURED}
    if fields["usage"] is not None:
        fields["usage"] = {key: value for key, value in fields["usage"].items() if key not in _MEASURED_USAGE}
    return fields


@pytest.fixture(scope="module")
def ray_pool(cluster: object) -> Iterator[RayPool]:
    with RayPool(workers=1) as pool:
        yield pool


@pytest.fixture(scope="module")
def local_pool() -> Iterator[pynox.Pool]:
    with pynox.Pool(workers=1) as pool:
        yield pool


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-out")


def search(query: str, limit: int = 2) -> list[str]:
    """Search the catalog."""
    return [f"{query}-{i}" for i in range(limit)]


def broken(query: str) -> str:
    raise ValueError(f"database password in {query}")


def refusing(query: str) -> str:
    raise HostError(f"no results for {query}")


def huge() -> str:
    return "x" * (2 << 20)


HOST = {"search": search, "broken": broken, "refusing": refusing, "huge": huge}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "value": ("x = 6 * 7\nprint('hi')\nx", {}),
    "raises": ("def f():\n    raise ValueError('bad')\nf()", {}),
    "syntax": ("def (", {}),
    "denied read": ("open('/etc/shadow').read()", {}),
    "exit status": ("import sys\nsys.stderr.write('warn\\n')\nsys.exit(3)", {}),
    "timeout": ("while True:\n    pass", {"timeout": "0.5s"}),
    "truncated": ("print('x' * 5000)", {"max_output": 1000}),
    "network denied": ("import socket\nsocket.socket().connect(('127.0.0.1', 9))", {}),
    "host call": ("from pynox_host import search\nprint(search('q', limit=3))", {"functions": HOST}),
    "host bad argument": ("from pynox_host import search\nsearch(7)", {"functions": HOST}),
    "host exception": ("from pynox_host import broken\nbroken('q')", {"functions": HOST}),
    "host error": ("from pynox_host import refusing\nrefusing('q')", {"functions": HOST}),
    "host over 1 MB": ("from pynox_host import huge\nhuge()", {"functions": HOST}),
    "host unknown": ("import pynox_host\npynox_host.call('nothere')", {"functions": HOST}),
}


@pytest.mark.parametrize("case", CASES)
def test_results_equal_a_local_pools(case: str, ray_pool: RayPool, local_pool: pynox.Pool, out: Path) -> None:
    code, grants = CASES[case]
    local = local_pool.run(code, **grants)
    remote = ray_pool.run(code, **grants)
    assert _described(remote) == _described(local)


def test_a_granted_write_lands_where_the_node_resolves_it(ray_pool: RayPool, local_pool: pynox.Pool,
                                                          out: Path) -> None:
    code = "open('{}/{}.txt', 'w').write('from the job')"
    local = local_pool.run(code.format(out, "local"), allow_write=[str(out)])
    remote = ray_pool.run(code.format(out, "local"), allow_write=[str(out)])
    assert _described(remote) == _described(local)
    assert remote.policy["allow_write"] == [str(out)]
    assert (out / "local.txt").read_text() == "from the job"


def test_runs_spread_over_both_nodes(ray_pool: RayPool, node_ids: list[str]) -> None:
    before = {node["node_id"]: node["runs_sent"] for node in ray_pool.stats()["nodes"]}
    code = "import time\ntime.sleep(0.3)"
    threads = [threading.Thread(target=ray_pool.run, args=(code,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    stats = ray_pool.stats()
    sent = {node["node_id"]: node["runs_sent"] - before[node["node_id"]] for node in stats["nodes"]}
    assert sorted(sent) == sorted(node_ids) and sent == dict.fromkeys(node_ids, 2)
    assert stats["jobs"] == sum(node["pool"]["jobs"] for node in stats["nodes"])


def test_host_functions_on_a_remote_node_run_in_the_callers_process(cluster: object, node_ids: list[str],
                                                                     local_pool: pynox.Pool) -> None:
    where: list[tuple[int, str]] = []

    def locate(tag: str) -> int:
        where.append((os.getpid(), tag))
        return len(where)

    async def alocate(tag: str) -> int:
        await asyncio.sleep(0)
        return locate(tag)

    # Eight calls at once (the pool's most), so a loaded machine's round trips do not add up to the timeout; then
    # the 1,001st from the main thread. Not the 1,001st inside the map: its traceback passes through
    # Future.result, whose line depends on whether that future had finished when the main thread reached it
    # (_base.py 449 or 456), so the job's own stderr differed between two runs of the same pool under load.
    many = ("from concurrent.futures import ThreadPoolExecutor\nfrom pynox_host import locate\n"
            "with ThreadPoolExecutor(8) as calls:\n    list(calls.map(lambda i: locate('many'), range(1000)))\n"
            "locate('the 1001st')")
    with RayPool(workers=1, nodes=[node_ids[1]]) as remote:
        result = remote.run("from pynox_host import locate\nprint(locate('sync'))", functions={"locate": locate})
        assert result.stdout == "1\n" and result.usage is not None and result.usage.host_calls == 1
        awaited = asyncio.run(remote.arun("from pynox_host import alocate\nprint(alocate('async'))",
                                          functions={"alocate": alocate}))
        assert awaited.ok, awaited.text
        threaded = remote.run("from pynox_host import alocate\nprint(alocate('async in run'))",
                              functions={"alocate": alocate})
        assert threaded.ok, threaded.text
        assert [pid for pid, _ in where] == [os.getpid()] * 3
        # The 1,000-call limit is the node pool's own: the 1,001st call fails there, as it does locally.
        where.clear()
        limited = remote.run(many, functions={"locate": locate}, timeout="90s")
    assert len(where) == 1000 and {tag for _, tag in where} == {"many"}
    where.clear()
    assert _described(limited) == _described(local_pool.run(many, functions={"locate": locate}, timeout="90s"))
    assert limited.error is not None and limited.error["type"] == "HostError", limited.text
    assert limited.error["line"] == 5 and limited.stderr.count("File ") == 1, limited.stderr  # the main thread's


def test_sessions_keep_their_state_on_one_node(ray_pool: RayPool, node_ids: list[str]) -> None:
    first = ray_pool.session(functions={"search": search})
    second = ray_pool.session()
    try:
        assert first.run("total = 0").ok and second.run("total = 100").ok
        assert {first.node_id, second.node_id} == set(node_ids), "two sessions went to one node"
        for step in range(1, 5):
            first.run(f"total += {step}")
            second.run(f"total += {step}")
        assert first.node_id in node_ids
        assert first.run("print(total)").stdout == "10\n" and second.run("print(total)").stdout == "110\n"
        called = first.run("from pynox_host import search\nprint(search('s', limit=1))")
        assert called.stdout == "['s-0']\n" and called.session is not None and called.step == 7
        active = {node["node_id"]: node["pool"]["sessions_active"] for node in ray_pool.stats()["nodes"]}
        assert active == dict.fromkeys(node_ids, 1)
        assert first.alive and first.steps == 7
    finally:
        first.close()
        second.close()
    assert not first.alive
    assert ray_pool.stats()["sessions_active"] == 0
    assert first.run("print('total' in globals())").stdout == "False\n", "a closed session kept its state"
    first.close()


def test_a_session_step_that_crashes_ends_it_as_locally(ray_pool: RayPool, local_pool: pynox.Pool) -> None:
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    with ray_pool.session() as remote, local_pool.session() as local:
        remote.run("x = 1")
        local.run("x = 1")
        ended_remote, ended_local = remote.run(code), local.run(code)
        assert ended_remote.session_ended and not remote.alive
        assert {**_described(ended_remote), "session": None} == {**_described(ended_local), "session": None}


def test_the_model_tool_runs_on_the_cluster(ray_pool: RayPool) -> None:
    run_python = ray_pool.tool(session=True, functions={"search": search}, timeout="5s")
    try:
        assert "search(query: str, limit: int = 2)" in (run_python.__doc__ or "")
        assert run_python("n = 41") == "(The code ran without printing anything. Use print() to show results.)"
        assert run_python("n + 1") == "Out: 42"
        assert run_python("from pynox_host import search\nprint(search('t'))") == "['t-0', 't-1']"
    finally:
        run_python.close()  # type: ignore[attr-defined]


def test_a_cancelled_arun_kills_its_job_on_the_node(ray_pool: RayPool) -> None:
    before = ray_pool.stats()["cancelled"]

    async def give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ray_pool.arun("import time\ntime.sleep(30)", timeout="20s"), 1.0)

    asyncio.run(give_up())
    deadline = time.monotonic() + 10
    while ray_pool.stats()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray_pool.stats()["cancelled"] == before + 1


def test_a_killed_node_answers_each_run_once_and_the_rest_go_on(cluster: object, node_ids: list[str]) -> None:
    lock = threading.Lock()
    started: list[str] = []
    two_running = threading.Event()
    results: dict[str, list[pynox.Result]] = {}

    def begin(token: str) -> None:
        with lock:
            started.append(token)
            if len(started) >= 2:
                two_running.set()

    code = "from pynox_host import begin\nbegin({0!r})\nimport time\ntime.sleep(1.5)\nprint({0!r})"
    with RayPool(workers=1) as pool:

        def one(token: str) -> None:
            result = pool.run(code.format(token), functions={"begin": begin}, timeout="20s")
            with lock:
                results.setdefault(token, []).append(result)

        threads = [threading.Thread(target=one, args=(f"job-{i}",)) for i in range(6)]
        for thread in threads:
            thread.start()
        assert two_running.wait(60), "the jobs did not start"
        # Each node holds three (one running, two queued in its pool); the added node's actor is killed.
        victim = next(node for node in pool.stats()["nodes"] if node["node_id"] == node_ids[1])
        assert victim["in_flight"] == 3
        ray.kill(ray.get_actor(victim["actor"]))
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(results) == [f"job-{i}" for i in range(6)]
        assert all(len(answers) == 1 for answers in results.values()), results
        answers = [answer for answers in results.values() for answer in answers]
        lost = [answer for answer in answers if answer.error and answer.error["type"] == "PoolWorkerError"]
        assert len(lost) == 3 and {answer.exit for answer in lost} == {70}
        assert all("was lost while this job was in flight" in answer.text for answer in lost)
        survivors = [token for token, (answer,) in results.items() if answer.ok]
        assert len(survivors) == 3 and all(results[token][0].stdout == f"{token}\n" for token in survivors)
        assert len(started) == len(set(started)), "a job ran twice"
        # Later runs go to the node that is left.
        assert all(pool.run("print('after')").stdout == "after\n" for _ in range(4))
        stats = pool.stats()
        assert stats["nodes_alive"] == 1 and stats["nodes_lost"] == 1 and stats["runs_lost"] == 3
        gone = next(node for node in stats["nodes"] if node["node_id"] == node_ids[1])
        assert not gone["alive"] and "ActorDiedError" in gone["lost"] and gone["runs_lost"] == 3
        assert gone["runs_sent"] == 3


@pytest.mark.parametrize("options, error, message", [
    ({"workers": 0}, ConfigError, "workers must be at least 1, got 0"),
    ({"workers": "2"}, ConfigError, "workers must be an integer"),
    ({"nodes": ["no-such-node"]}, ConfigError, "nodes must name alive Ray nodes"),
    ({"nodes": 99}, ConfigError, "nodes must be between 1 and the 2 alive nodes, got 99"),
    ({"nodes": "all"}, ConfigError, "nodes must be a count or a list of Ray node IDs"),
    ({"host_errors": "loud"}, ConfigError, "host_errors must be 'safe' or 'full'"),
    ({"preload": "pandas"}, TypeError, "preload must be a list"),
])
def test_bad_pool_options_are_clear_errors(cluster: object, options: dict[str, Any], error: type[Exception],
                                           message: str) -> None:
    with pytest.raises(error, match=message):
        RayPool(**options)


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


@pytest.mark.parametrize("grants", [
    {"allow_read": "data"},
    {"timeout": "soon"},
    {"nonsense": 1},
    {"functions": {"not a name": search}},
    {"memory": "-3"},
])
def test_bad_requests_fail_as_they_do_locally(grants: dict[str, Any], ray_pool: RayPool,
                                              local_pool: pynox.Pool) -> None:
    local = _raised(lambda: local_pool.run("print(1)", **grants))
    remote = _raised(lambda: ray_pool.run("print(1)", **grants))
    # A misspelt grant is named by the method it was given to: RayPool.run() where Pool.run() says its own.
    assert (type(remote), str(remote).replace("RayPool.", "Pool.")) == (type(local), str(local))


def test_bad_session_use_is_a_clear_error(ray_pool: RayPool) -> None:
    # As Pool.session(): a session's grants have no script (typed grants), so the name is refused as a typo is.
    with pytest.raises(TypeError, match=r"RayPool.session\(\) got an unknown grant 'script'"):
        ray_pool.session(script="job.py")  # type: ignore[call-arg]
    with ray_pool.session(functions={"search": search}) as session, \
            pytest.raises(RequestError, match="not among them: broken"):
        session.run("print(1)", functions={"broken": broken})


def test_a_config_the_node_cannot_read_fails_as_locally(cluster: object, tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    local = _raised(lambda: pynox.Pool(workers=1, config=missing))
    with RayPool(workers=1, config=missing) as pool:
        remote = _raised(lambda: pool.run("print(1)"))
    assert (type(remote), str(remote)) == (type(local), str(local))


def test_a_closed_pool_refuses_runs(cluster: object) -> None:
    pool = RayPool(workers=1, nodes=1)
    pool.close()
    pool.close()
    with pytest.raises(PoolError, match="this pool is closed"):
        pool.run("print(1)")


# -- found by review ---------------------------------------------------------------------------------------------

GCS_HANDSHAKE = """
import socket
s = socket.create_connection(({host!r}, {port}), timeout=5)
s.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + bytes.fromhex("000000040000000000"))
print("answered", s.recv(9)[3])
open({marker!r}, "w").write("ran")
"""


def test_the_network_grant_is_refused_unless_the_operator_allows_it(cluster: object, out: Path) -> None:
    """A job with the network reaches the cluster's own unauthenticated services (the GCS answers it): a
    RayPool grants it only when made with network_grants=True."""
    host, port = ray._private.worker.global_worker.node.gcs_address.rsplit(":", 1)
    marker = out / "network-job-ran"
    code = GCS_HANDSHAKE.format(host=host, port=int(port), marker=str(marker))
    with RayPool(workers=1, nodes=1) as pool:
        with pytest.raises(RequestError, match=r"network_grants=True"):
            pool.run(code, allow_network=True, allow_write=[str(out)])
        with pytest.raises(RequestError, match=r"network_grants=True"):
            pool.session(allow_network=True)
        with pytest.raises(RequestError, match=r"network_grants=True"):
            pool.tool(allow_network=True)
        # A narrower grant is no way round it: the cluster's own service is a host that can be listed.
        with pytest.raises(RequestError, match=r"allow_hosts: .*network_grants=True"):
            pool.run(code, allow_hosts=[f"{host}:{port}"], allow_write=[str(out)])
        with pytest.raises(RequestError, match=r"allow_hosts: .*network_grants=True"):
            pool.tool(allow_hosts=[f"{host}:{port}"])
        assert not marker.exists()
    with RayPool(workers=1, nodes=1, network_grants=True) as pool:  # the control: the harm is real
        result = pool.run(code, allow_network=True, allow_write=[str(out)], timeout="20s")
        assert result.exit == 0 and result.stdout.startswith("answered 4"), result.text  # an HTTP/2 SETTINGS frame
        assert marker.read_text() == "ran"
        marker.unlink()
        listed = pool.run(code, allow_hosts=[f"{host}:{port}"], allow_write=[str(out)], timeout="20s")
        assert listed.exit == 0 and listed.stdout.startswith("answered 4"), listed.text
        assert marker.read_text() == "ran"


def test_a_connection_without_its_callers_token_runs_nothing(ray_pool: RayPool, out: Path) -> None:
    """The lines travel on a TCP connection to each node's actor: another connection to that port (any process
    on the network, or a job given it) that does not present the caller's token is closed unread, and the job
    it sends never runs. The control is the same job through the pool's own connection."""
    ray_pool.run("print(1)")
    fleet = ray_pool._fleet  # the address is the product's own; the test only borrows it
    assert fleet is not None
    address = fleet.nodes.serving()[0].pipe.getpeername()  # type: ignore[union-attr]
    marker = out / "intruder-ran"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    line = json.dumps({"id": "intruder", "code": code, "allow_write": [str(out)]}).encode() + b"\n"
    for hello in (b"\n", b"0" * 64 + b"\n", line):
        with socket.create_connection(address, timeout=10) as intruder:
            intruder.sendall(hello + line)
            assert intruder.recv(1) == b"", "the actor answered a connection without the token"
    time.sleep(1)
    assert not marker.exists()
    assert ray_pool.run(code, allow_write=[str(out)]).ok  # the control: the job writes when it runs
    assert marker.read_text() == "ran"
    marker.unlink()


def test_a_tool_describes_the_paths_the_node_grants(cluster: object, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("lamp\n")
    with RayPool(workers=1, nodes=1, cwd=tmp_path) as pool:
        run_python = pool.tool(allow_read=["data"])
        assert f"Read files: {tmp_path / 'data'} " in (run_python.__doc__ or "")
        assert run_python(f"print(open({str(tmp_path / 'data' / 'orders.csv')!r}).read())").strip() == "lamp"


def test_bad_options_and_inputs_are_clear_errors(cluster: object) -> None:
    with pytest.raises(ConfigError, match="nodes must be a count or a list"):
        RayPool(nodes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="preload must be a list"):
        RayPool(preload=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="network_grants must be True or False"):
        RayPool(network_grants="yes")  # type: ignore[arg-type]
    with RayPool(workers=1, nodes=1) as pool:
        with pytest.raises(RequestError, match="functions must map names to callables"):
            pool.session(functions=3)  # type: ignore[arg-type]
        with pytest.raises(RequestError, match="functions must map names to callables"):
            pool.run("print(1)", functions={"f": 3})  # type: ignore[dict-item]
        session = pool.session()
        with pytest.raises(RequestError, match="exactly one of code and script is required"):
            session.run(None)  # type: ignore[arg-type]
        session.close()
