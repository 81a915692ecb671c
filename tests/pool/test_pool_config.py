"""Configuration through the real pool: ``--config=pynox.toml`` with [pool], [pool.limits] and [profiles.*].

Layout (``tree`` fixture)::

    tmp/etc/pynox.toml     the config file; its relative paths resolve against tmp/etc
    tmp/etc/site           a package dir named relatively in the file
    tmp/srv/data           readable under the ceiling
    tmp/srv/work           writable under the ceiling
    tmp/outside            never granted
    tmp/app                the pool's working directory (relative request paths resolve here)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.config_tree import Tree, make_tree

from .pool_driver import PoolProcess, pool_process, refused

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path)


FULL = """
    [pool]
    workers = 3
    preload = ["colorsys"]
    package_dirs = ["site"]
    max_sessions = 1
    session_idle = "15m"
    log = "json"

    [pool.limits]
    allow_read = ["../srv/data"]
    allow_write = ["../srv/work"]
    allow_network = true
    timeout = "10s"
    memory = "512m"
    max_output = 4096
    max_file_size = "64k"

    [profiles.analysis]
    allow_read = ["../srv/data"]
    allow_write = ["../srv/work"]

    [profiles.fetch]
    allow_network = true
"""


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PoolProcess, Tree]]:
    """One pool under the full example config, shared by the tests that only send requests."""
    tree = make_tree(tmp_path_factory.mktemp("configured"))
    config = tree.config(FULL)
    with pool_process(f"--config={config}", cwd=tree.app) as pool:
        yield pool, tree


# --- [pool] defaults and the command line ---------------------------------------------------------------


def test_pool_table_provides_the_defaults(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    ready = pool.ready
    assert ready["workers"] == 3 and len(pool.templates()) == 3
    assert ready["preloaded_modules"] == ["colorsys"]
    assert ready["package_dirs"] == [str(tree.site)]
    assert ready["config"] == str(tree.etc / "pynox.toml")
    assert ready["profiles"] == ["analysis", "fetch"]
    result = pool.run("import sys\nprint('colorsys' in sys.modules)\nimport config_helpers\n"
                      "print(config_helpers.ANSWER)")
    assert result["stdout"] == "True\nfrom the config\n", result
    assert result["runtime"]["preloaded_modules"] == ["colorsys"]
    # log = "json"
    assert any(line.get("id") == result["id"] for line in _wait_logs(pool, result["id"]))


def _wait_logs(pool: PoolProcess, request_id: object) -> list[dict[str, Any]]:
    import time

    end = time.monotonic() + 5
    while time.monotonic() < end:
        lines = pool.log_lines()
        if any(line.get("id") == request_id for line in lines):
            return lines
        time.sleep(0.02)
    return pool.log_lines()


def test_pool_max_sessions_from_the_file(configured: tuple[PoolProcess, Tree]) -> None:
    pool, _ = configured
    first = pool.run("x = 1", session="only-one")
    assert first["exit"] == 0, first
    refused(pool.run("x = 1", session="second"), "max_sessions")
    pool.run(session="only-one", close=True)


def test_the_command_line_overrides_the_pool_table(tree: Tree) -> None:
    config = tree.config(FULL)
    other = tree.root / "other_site"
    other.mkdir()
    (other / "cli_helpers.py").write_text("ANSWER = 'from the command line'\n")
    with pool_process(f"--config={config}", "--workers=1", "--preload=wave", f"--package-dir={other}",
                      "--max-sessions=2", "--log=none", cwd=tree.app) as pool:
        assert pool.ready["workers"] == 1 and len(pool.templates()) == 1
        assert pool.ready["preloaded_modules"] == ["wave"]
        assert pool.ready["package_dirs"] == [str(other)]
        result = pool.run("import cli_helpers\nprint(cli_helpers.ANSWER)")
        assert result["stdout"] == "from the command line\n", result
        for name in ("a", "b"):
            assert pool.run("x = 1", session=name)["exit"] == 0
        assert pool.stats()["sessions_active"] == 2
        for name in ("a", "b"):
            pool.run(session=name, close=True)
    assert [line for line in pool.log_lines() if line.get("event") == "job"] == []


def test_session_idle_from_the_file(tree: Tree) -> None:
    config = tree.config("""
        [pool]
        session_idle = "1s"
    """)
    with pool_process(f"--config={config}", "--workers=1", cwd=tree.app) as pool:
        assert pool.run("x = 1", session="idle")["exit"] == 0
        import time

        deadline = time.monotonic() + 5
        while pool.stats()["sessions_active"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.stats()["sessions_active"] == 0


# --- the ceiling ----------------------------------------------------------------------------------------


def test_requests_within_the_ceiling_run(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    inside = pool.run(f"print(open({str(tree.data / 'orders.csv')!r}).read(), end='')\n"
                      f"open({str(tree.work / 'out.txt')!r}, 'w').write('ok')",
                      allow_read=[str(tree.data)], allow_write=[str(tree.work)], timeout="10s", memory="512m",
                      max_output=4096, max_file_size="64k")
    assert inside["exit"] == 0, inside
    assert inside["stdout"] == "product,amount\n"
    assert (tree.work / "out.txt").read_text() == "ok"


@pytest.mark.parametrize("fields, limit", [
    ({"allow_read": ["OUTSIDE"]}, "allow_read"),
    ({"allow_read": ["ROOT"]}, "allow_read"),
    ({"allow_read": ["DATA/../../outside"]}, "allow_read"),
    ({"allow_write": ["OUTSIDE"]}, "allow_write"),
    ({"allow_write": ["DATA"]}, "allow_write"),  # readable under the ceiling, not writable
    ({"package_dirs": ["OUTSIDE"]}, "package_dirs"),
    ({"allow_network": True}, None),  # allowed: the limits say allow_network = true
    ({"timeout": "11s"}, "timeout"),
    ({"timeout": 60}, "timeout"),
    ({"memory": "1g"}, "memory"),
    ({"max_output": 4097}, "max_output"),
    ({"max_file_size": "1m"}, "max_file_size"),
], ids=lambda v: str(v))
def test_a_request_outside_the_ceiling_fails_naming_the_limit(configured: tuple[PoolProcess, Tree],
                                                              fields: dict[str, Any], limit: str | None) -> None:
    pool, tree = configured
    paths = {"OUTSIDE": str(tree.outside), "ROOT": str(tree.root), "DATA": str(tree.data)}
    request = {k: [_expand(p, paths) for p in v] if isinstance(v, list) else v for k, v in fields.items()}
    request.setdefault("allow_write", [str(tree.work)])
    marker = tree.work / f"ran-{limit}"
    result = pool.run(f"open({str(marker)!r}, 'w')", **request)
    if limit is None:
        assert result["exit"] == 0, result
        return
    refused(result, limit)
    assert not marker.exists(), "the refused request ran"


def _expand(value: str, paths: dict[str, str]) -> str:
    for key, path in paths.items():
        value = value.replace(key, path)
    return value


def test_a_symlink_out_of_a_granted_directory_is_outside(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    link = tree.data / "escape"
    if not link.exists():
        link.symlink_to(tree.outside)
    refused(pool.run("print(1)", allow_read=[str(link)]), "allow_read")


def test_the_network_needs_allow_network_in_the_limits(tree: Tree) -> None:
    config = tree.config(f"""
        [pool.limits]
        allow_read = ["{tree.data}"]
        allow_network = false
    """)
    with pool_process(f"--config={config}", "--workers=1", cwd=tree.app) as pool:
        refused(pool.run("print(1)", allow_network=True), "allow_network")
        assert pool.run("print(1)", allow_network=False)["exit"] == 0
        assert pool.run("print(1)")["policy"]["network"] == "deny"


def test_paths_are_refused_when_the_limits_list_none(tree: Tree) -> None:
    config = tree.config("""
        [pool.limits]
        timeout = "5s"
    """)
    with pool_process(f"--config={config}", "--workers=1", cwd=tree.app) as pool:
        refused(pool.run("print(1)", allow_read=[str(tree.data)]), "allow_read")
        refused(pool.run("print(1)", allow_write=[str(tree.work)]), "allow_write")
        assert pool.run("print(1)")["exit"] == 0


def test_a_max_file_size_limit_applies_to_requests_that_set_none(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    code = (f"f = open({str(tree.work / 'big.bin')!r}, 'wb', buffering=0)\n"
            "for _ in range(130):\n    f.write(b'x' * 1024)")
    result = pool.run(code, allow_write=[str(tree.work)])
    assert result["policy"]["max_file_size"] == 64 * 1024
    assert result["exit"] != 0 and result["error"]["hint"], result
    assert (tree.work / "big.bin").stat().st_size <= 64 * 1024


def test_limits_cap_requests_that_set_no_timeout_memory_or_output(configured: tuple[PoolProcess, Tree]) -> None:
    pool, _ = configured
    policy = pool.run("print(1)")["policy"]
    assert policy["timeout_ms"] <= 10_000
    assert policy["memory_bytes"] <= 512 << 20
    truncated = pool.run("print('x' * 10000)")
    assert len(truncated["stdout"]) <= 4096 and truncated["stdout_truncated"] is True


def test_a_session_first_request_is_held_to_the_ceiling(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    refused(pool.run("x = 1", session="ceiling", allow_read=[str(tree.outside)]), "allow_read")
    assert pool.run("x = 1", session="ceiling")["exit"] == 0
    refused(pool.run("print(x)", session="ceiling", timeout="1m"), "timeout")
    refused(pool.run("print(x)", session="ceiling", max_output=10_000), "max_output")
    assert pool.run("print(x)", session="ceiling", timeout="2s")["stdout"] == "1\n"
    pool.run(session="ceiling", close=True)


# --- profiles -------------------------------------------------------------------------------------------


def test_a_profile_is_a_preset_and_relative_paths_resolve_against_the_file(
        configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    result = pool.run(f"print(open({str(tree.data / 'orders.csv')!r}).read(), end='')", profile="analysis")
    assert result["exit"] == 0, result
    assert result["policy"]["allow_read"][:1] == [str(tree.data)]
    assert result["policy"]["allow_write"] == [str(tree.work)]


def test_a_requests_own_fields_are_added_on_top_of_its_profile(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    sub = tree.data / "sub"
    sub.mkdir(exist_ok=True)
    result = pool.run("print(1)", profile="fetch", allow_read=[str(sub)], env={"K": "v"})
    assert result["exit"] == 0, result
    assert result["policy"]["network"] == "allow"
    assert str(sub) in result["policy"]["allow_read"]
    merged = pool.run("print(1)", profile="analysis", allow_read=[str(sub)])
    assert {str(tree.data), str(sub)} <= set(merged["policy"]["allow_read"])
    assert merged["policy"]["allow_write"] == [str(tree.work)]


def test_the_ceiling_applies_after_the_profile_merge(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    refused(pool.run("print(1)", profile="analysis", allow_read=[str(tree.outside)]), "allow_read")
    refused(pool.run("print(1)", profile="fetch", timeout="1m"), "timeout")


def test_an_unknown_profile_is_a_request_error(configured: tuple[PoolProcess, Tree]) -> None:
    pool, _ = configured
    refused(pool.run("print(1)", profile="nope"), "nope")


# --- files the pool refuses to start with ---------------------------------------------------------------


def _refused_start(tree: Tree, config: Path) -> str:
    with PoolProcess(f"--config={config}", cwd=tree.app, expect_ready=False) as pool:
        first = pool.wait_for(lambda m: True, timeout=60)
        status = pool.wait_exit()
    assert first.get("event") == "error", first
    assert status != 0
    return first["error"]["message"]


def test_a_config_file_beneath_its_own_write_grant_is_refused(tree: Tree) -> None:
    config = tree.config("""
        [pool.limits]
        allow_write = ["."]
    """, where=tree.work)
    message = _refused_start(tree, config)
    assert "pynox.toml" in message and "allow_write" in message, message


@pytest.mark.parametrize("text, named", [
    ("[pool]\nwrkers = 2\n", "wrkers"),
    ("[pool.limits]\ntimeout = '5s'\nmemroy = '1g'\n", "memroy"),
    ("[profiles.analysis]\nallow_reed = ['data']\n", "allow_reed"),
    ("[pools]\nworkers = 2\n", "pools"),
    ("[pool]\nworkers = 'two'\n", "workers"),
    ("[pool]\nworkers = \n", "TOML"),
], ids=["pool-key", "limits-key", "profile-key", "table", "type", "syntax"])
def test_unknown_keys_and_bad_values_refuse_the_start_naming_them(tree: Tree, text: str, named: str) -> None:
    config = tree.etc / "pynox.toml"
    config.write_text(text)
    message = _refused_start(tree, config)
    assert named in message, message


def test_a_missing_config_file_refuses_the_start(tree: Tree) -> None:
    assert "nope.toml" in _refused_start(tree, tree.etc / "nope.toml")


def test_the_permissions_section_does_not_apply_to_the_pool(tree: Tree) -> None:
    """The command line's [permissions] grants nothing here: the pool ignores it, and says so once."""
    config = tree.config(f"""
        [permissions]
        allow_read = ["{tree.outside}"]
    """)
    with pool_process(f"--config={config}", "--workers=1", cwd=tree.app) as pool:
        result = pool.run(f"print(open({str(tree.outside / 'secret.txt')!r}).read())")
        assert result["error"]["type"] == "PermissionError", result
    warnings = [line for line in bytes(pool.stderr).decode().splitlines() if "warning" in line]
    assert len(warnings) == 1 and "[permissions]" in warnings[0], warnings


def test_the_protocol_documents_example_config_starts(tree: Tree) -> None:
    """As docs/protocol.md writes it: a profile that wants the network under a ceiling that denies it. The
    pool starts, lists the profile, warns once, and refuses each request that names it."""
    config = tree.config(f"""
        [pool]
        workers = 1
        max_sessions = 32
        session_idle = "15m"

        [pool.limits]
        allow_read = ["{tree.data}"]
        allow_write = ["{tree.work}"]
        allow_network = false
        timeout = "30s"
        memory = "1g"

        [profiles.analysis]
        allow_read = ["{tree.data}"]
        allow_write = ["{tree.work}"]

        [profiles.fetch]
        allow_network = true
    """)
    with pool_process(f"--config={config}", cwd=tree.app) as pool:
        assert pool.ready["profiles"] == ["analysis", "fetch"]
        refused = pool.run("print(1)", profile="fetch")
        assert refused["error"]["type"] == "RequestError" and "allow_network" in refused["error"]["message"]
        served = pool.run("print('analysed')", profile="analysis")
        assert served["stdout"] == "analysed\n", served
    warnings = [line for line in bytes(pool.stderr).decode().splitlines() if "warning" in line]
    assert len(warnings) == 1 and "[profiles.fetch]" in warnings[0] and "allow_network" in warnings[0], warnings


def test_package_dirs_from_the_config_are_readable_in_every_job(configured: tuple[PoolProcess, Tree]) -> None:
    pool, tree = configured
    for _ in range(4):
        result = pool.run(f"print(open({str(tree.site / 'config_helpers.py')!r}).read(), end='')")
        assert result["stdout"] == "ANSWER = 'from the config'\n", result


def test_relative_request_paths_resolve_against_the_pools_directory(tree: Tree) -> None:
    (tree.app / "local").mkdir()
    config = tree.config(f"""
        [pool.limits]
        allow_read = ["{tree.app}"]
    """)
    with pool_process(f"--config={config}", "--workers=1", cwd=tree.app) as pool:
        result = pool.run("print(1)", allow_read=["local"])
        assert result["policy"]["allow_read"] == [str(tree.app / "local")], result
        assert os.path.isabs(result["policy"]["allow_read"][0])
