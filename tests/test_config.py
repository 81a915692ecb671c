"""pynox.config: loading pynox.toml, merging profiles and enforcing the [pool.limits] ceiling.

Pure tests: real TOML files, real directories and symlinks under tmp_path, no processes.
The layout every test shares::

    tmp/etc/pynox.toml      the config file (outside every grant unless a test says otherwise)
    tmp/srv/data            readable under the ceiling
    tmp/srv/work            writable under the ceiling
    tmp/srv/data2           a sibling whose name starts with "data": not beneath data
    tmp/outside             never granted
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pynox.cli import build_parser
from pynox.config import EMPTY, LANDLOCK_ABI_VARIABLE, Limits, PoolSettings, load_config, pool_options
from pynox.defaults import DEFAULTS
from pynox.errors import ConfigError, RequestError
from pynox.protocol import Request
from pynox.server.jobs import to_job
from tests.config_tree import Tree, make_tree

pytestmark = pytest.mark.pure


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path)


def run(**fields: object) -> Request:
    return Request(code="print(1)", **fields)  # type: ignore[arg-type]


# --- loading: the file and its tables -------------------------------------------------------------


def test_empty_file_gives_defaults_and_no_ceiling(tree: Tree) -> None:
    config = tree.load("")
    assert config.path == str(tree.etc / "pynox.toml")
    assert config.pool == PoolSettings()
    assert config.pool.max_sessions == 16 and config.pool.session_idle == 600.0
    assert config.limits is None
    assert dict(config.profiles) == {}


def test_empty_config_has_no_ceiling_and_no_profiles(tree: Tree) -> None:
    assert EMPTY.path is None and EMPTY.limits is None and not EMPTY.profiles
    request = run(allow_read=["/etc"], allow_write=[str(tree.outside)], allow_network=True, timeout="7d")
    assert EMPTY.apply(request, str(tree.root)) == request


def test_the_spec_example_loads_with_every_value(tree: Tree) -> None:
    site = tree.root / "site-packages"
    site.mkdir()
    config = tree.load(f"""
        [pool]
        workers = 4
        preload = ["pandas", "os.path"]
        package_dirs = ["{site}"]
        max_sessions = 32
        session_idle = "15m"
        log = "json"
        run_as = "65534:65534"

        [pool.limits]
        allow_read = ["{tree.data}"]
        allow_write = ["{tree.work}"]
        allow_network = true
        timeout = "30s"
        memory = "1g"
        max_output = 1048576
        max_file_size = "256m"

        [profiles.analysis]
        allow_read = ["{tree.data}"]
        allow_write = ["{tree.work}"]

        [profiles.fetch]
        allow_network = true
    """)
    assert config.pool == PoolSettings(workers=4, preload=("pandas", "os.path"), package_dirs=(str(site),),
                                       max_sessions=32, session_idle=900.0, log="json", run_as=(65534, 65534))
    assert config.limits == Limits(allow_read=(str(tree.data),), allow_write=(str(tree.work),),
                                   allow_network=True, timeout=30.0, memory=1 << 30, max_output=1 << 20,
                                   max_file_size=256 << 20)
    assert sorted(config.profiles) == ["analysis", "fetch"]
    assert config.profiles["analysis"].allow_read == [str(tree.data)]
    assert config.profiles["analysis"].allow_write == [str(tree.work)]
    assert config.profiles["fetch"].allow_network is True


def test_settings_are_frozen(tree: Tree) -> None:
    config = tree.load("[pool]\nworkers = 2\n")
    with pytest.raises(AttributeError):
        config.pool.workers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.profiles["x"] = run()  # type: ignore[index]


def test_relative_paths_resolve_against_the_file_directory_not_the_cwd(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree.etc / "site").mkdir(exist_ok=True)
    (tree.etc / "data").mkdir()
    monkeypatch.chdir(tree.outside)
    config = tree.load("""
        [pool]
        package_dirs = ["site"]
        [pool.limits]
        allow_read = ["data", "../srv/data", "site"]
        [profiles.p]
        allow_read = ["data/sub"]
        package_dirs = ["site"]
    """)
    assert config.pool.package_dirs == (str(tree.etc / "site"),)
    assert config.limits is not None
    assert config.limits.allow_read == (str(tree.etc / "data"), str(tree.data), str(tree.etc / "site"))
    assert config.profiles["p"].allow_read == [str(tree.etc / "data" / "sub")]
    assert config.profiles["p"].package_dirs == [str(tree.etc / "site")]


def test_a_relative_config_path_is_made_absolute(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    tree.config('[pool.limits]\nallow_read = ["../srv/data"]\n')
    monkeypatch.chdir(tree.etc)
    config = load_config("pynox.toml")
    assert config.path == str(tree.etc / "pynox.toml")
    assert config.limits is not None and config.limits.allow_read == (str(tree.data),)


def test_home_in_a_path_is_expanded(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tree.root / "srv"))
    config = tree.load('[pool.limits]\nallow_read = ["~/data"]\n')
    assert config.limits is not None and config.limits.allow_read == (str(tree.data),)


def test_limit_paths_are_resolved_through_symlinks(tree: Tree) -> None:
    (tree.etc / "link").symlink_to(tree.data)
    config = tree.load('[pool.limits]\nallow_read = ["link", "link/../data"]\n')
    assert config.limits is not None and config.limits.allow_read == (str(tree.data),)


@pytest.mark.parametrize("key", ["allow_read", "allow_write"])
def test_limit_paths_must_exist(tree: Tree, key: str) -> None:
    path = tree.config(f'[pool.limits]\n{key} = ["{tree.root}/missing"]\n')
    with pytest.raises(ConfigError, match=rf"\[pool.limits\] {key}: .*missing does not exist") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_pool_package_dirs_must_exist(tree: Tree) -> None:
    with pytest.raises(ConfigError, match=r"\[pool\] package_dirs: .*nope does not exist"):
        tree.load('[pool]\npackage_dirs = ["nope"]\n')


def test_missing_file_is_a_config_error(tree: Tree) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tree.etc / "absent.toml")


def test_a_directory_is_not_a_config_file(tree: Tree) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tree.etc)


@pytest.mark.parametrize("content", [b"[pool\n", b"workers = = 1\n", b"[pool]\nworkers = 1\nworkers = 2\n",
                                     b"[pool]\n[pool]\n", b"a = \"\xff\"\n"])
def test_invalid_toml_is_a_config_error_naming_the_file(tree: Tree, content: bytes) -> None:
    path = tree.etc / "pynox.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)


# --- loading: unknown tables and keys, wrong types ------------------------------------------------

BAD = [
    # (file body, fragments the message must contain)
    ("[pools]\nworkers = 1\n", ["'pools'", "known tables"]),
    ("workers = 1\n", ["'workers'"]),
    ("[limits]\n", ["'limits'"]),
    ("[pool]\nworker = 1\n", ["[pool]", "'worker'"]),
    ("[pool]\nallow_read = []\n", ["[pool]", "'allow_read'"]),
    ("[pool.limits]\nallow_reads = []\n", ["[pool.limits]", "'allow_reads'"]),
    ("[pool.limits]\nworkers = 2\n", ["[pool.limits]", "'workers'"]),
    ("[pool.limits.extra]\n", ["[pool.limits]", "'extra'"]),
    ("[pool.other]\n", ["[pool]", "'other'"]),
    ("pool = 3\n", ["[pool]", "must be a table"]),
    ("[pool]\nlimits = 3\n", ["[pool.limits]", "must be a table"]),
    ("profiles = 3\n", ["profiles", "[profiles.NAME]"]),
    ("[profiles]\nx = 3\n", ["[profiles.x]", "must be a table"]),
    ("[pool]\nworkers = \"4\"\n", ["[pool] workers", "positive integer", "a string"]),
    ("[pool]\nworkers = true\n", ["[pool] workers", "a boolean"]),
    ("[pool]\nworkers = 2.0\n", ["[pool] workers", "a float"]),
    ("[pool]\nworkers = 0\n", ["[pool] workers", "positive"]),
    ("[pool]\nworkers = -3\n", ["[pool] workers", "positive"]),
    ("[pool]\nmax_sessions = 0\n", ["[pool] max_sessions", "positive"]),
    ("[pool]\nmax_sessions = \"32\"\n", ["[pool] max_sessions"]),
    ("[pool]\nmax_connections = 0\n", ["[pool] max_connections", "positive"]),
    ("[tenants.a]\nuids = [1]\nmax_connections = \"2\"\n", ["[tenants.a] max_connections", "positive integer"]),
    ("[pool]\npreload = \"pandas\"\n", ["[pool] preload", "list of strings"]),
    ("[pool]\npreload = [1]\n", ["[pool] preload", "1"]),
    ("[pool]\npreload = [\"\"]\n", ["[pool] preload"]),
    ("[pool]\npreload = [\"pan das\"]\n", ["[pool] preload", "not a module name"]),
    ("[pool]\npreload = [\"1numpy\"]\n", ["[pool] preload", "not a module name"]),
    ("[pool]\npreload = [\"os..path\"]\n", ["[pool] preload", "not a module name"]),
    ("[pool]\npackage_dirs = \"/usr\"\n", ["[pool] package_dirs", "list of strings"]),
    ("[pool]\nsession_idle = \"15x\"\n", ["[pool] session_idle", "not a duration"]),
    ("[pool]\nsession_idle = true\n", ["[pool] session_idle"]),
    ("[pool]\nsession_idle = 0\n", ["[pool] session_idle", "more than 0"]),
    ("[pool]\ninterrupt_grace = \"1x\"\n", ["[pool] interrupt_grace", "not a duration"]),
    ("[pool]\ninterrupt_grace = 0\n", ["[pool] interrupt_grace", "more than 0"]),
    ("[pool]\nstrict_session_reopen = \"yes\"\n", ["[pool] strict_session_reopen", "true or false"]),
    ("[pool]\nprepared_children = 9\n", ["[pool] prepared_children", "between 0 (none) and 8", "9"]),
    ("[pool]\nprepared_children = -1\n", ["[pool] prepared_children", "between 0 (none) and 8"]),
    ("[pool]\nprepared_children = \"2\"\n", ["[pool] prepared_children", "a whole number", "a string"]),
    ("[pool]\nprepared_children = true\n", ["[pool] prepared_children", "a boolean"]),
    ("[pool]\nprepared_children = 1.5\n", ["[pool] prepared_children", "a float"]),
    ("[pool]\nlog = \"text\"\n", ["[pool] log", "json"]),
    ("[pool]\nlog = true\n", ["[pool] log", "a boolean"]),
    ("[pool]\nrun_as = \"no-such-user-of-pynox\"\n", ["[pool] run_as", "no such user"]),
    ("[pool]\nrun_as = \"nobody:no-such-group-of-pynox\"\n", ["[pool] run_as", "no such user or group"]),
    ("[pool]\nrun_as = \"1:2:3\"\n", ["[pool] run_as", "user:group"]),
    ("[pool]\nrun_as = \"-1\"\n", ["[pool] run_as", "no such user"]),
    ("[pool]\nrun_as = \"\"\n", ["[pool] run_as", "uid:gid"]),
    ("[pool]\nrun_as = \"65534 : 65534\"\n", ["[pool] run_as", "no such user"]),
    ("[pool]\nrun_as = \"\uff11\uff12\"\n", ["[pool] run_as", "no such user"]),  # fullwidth digits
    ("[pool]\nrun_as = \"root\"\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = \"0\"\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = \"0:0\"\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = \"1000:0\"\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = \"0:1000\"\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = 0\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = -5\n", ["[pool] run_as", "numeric"]),
    ("[pool]\nrun_as = \"4294967295\"\n", ["[pool] run_as", "unprivileged"]),
    ("[pool]\nrun_as = true\n", ["[pool] run_as", "a boolean"]),
    ("[pool]\nrun_as = [1, 2]\n", ["[pool] run_as", "an array"]),
    ("[pool.limits]\nallow_network = \"yes\"\n", ["[pool.limits] allow_network", "true or false"]),
    ("[pool.limits]\nallow_network = 1\n", ["[pool.limits] allow_network", "true or false"]),
    ("[pool.limits]\nallow_read = \"/srv\"\n", ["[pool.limits] allow_read", "list of strings"]),
    ("[pool.limits]\nallow_write = [\"\"]\n", ["[pool.limits] allow_write", "non-empty"]),
    ("[pool.limits]\ntimeout = \"forever\"\n", ["[pool.limits] timeout", "not a duration"]),
    ("[pool.limits]\ntimeout = -1\n", ["[pool.limits] timeout", "more than 0"]),
    ("[pool.limits]\ntimeout = \"8d\"\n", ["[pool.limits] timeout"]),
    ("[pool.limits]\nmemory = -1\n", ["[pool.limits] memory", "more than 0"]),
    ("[pool.limits]\nmemory = \"1t\"\n", ["[pool.limits] memory", "not a size"]),
    ("[pool.limits]\nmax_output = 1.5\n", ["[pool.limits] max_output"]),
    ("[pool.limits]\nmax_file_size = [1]\n", ["[pool.limits] max_file_size"]),
    ("[pool.limits]\nmemory = 1979-05-27\n", ["[pool.limits] memory"]),
    # Larger than a float: must still be a ConfigError, not an OverflowError.
    ("[pool.limits]\ntimeout = 1" + "0" * 400 + "\n", ["[pool.limits] timeout"]),
    ("[pool.limits]\nmemory = \"" + "9" * 400 + "\"\n", ["[pool.limits] memory"]),
    ("[profiles.p]\ncode = \"print(1)\"\n", ["[profiles.p]", "'code'"]),
    ("[profiles.p]\nscript = \"a.py\"\n", ["[profiles.p]", "'script'"]),
    ("[profiles.p]\nname = \"a.py\"\n", ["[profiles.p]", "'name'"]),
    ("[profiles.p]\nargs = []\n", ["[profiles.p]", "'args'"]),
    ("[profiles.p]\nprofile = \"q\"\n", ["[profiles.p]", "'profile'"]),
    ("[profiles.p]\nsession = \"s\"\n", ["[profiles.p]", "'session'"]),
    ("[profiles.p]\nallow_reed = []\n", ["[profiles.p]", "'allow_reed'"]),
    ("[profiles.p.q]\n", ["[profiles.p]", "'q'"]),
    ("[profiles.p]\nallow_network = \"true\"\n", ["[profiles.p] allow_network", "true or false"]),
    ("[profiles.p]\nallow_read = \"data\"\n", ["[profiles.p] allow_read", "list of strings"]),
    ("[profiles.p]\nenv = [\"A=1\"]\n", ["[profiles.p] env", "table"]),
    ("[profiles.p]\nenv = {A = 1}\n", ["[profiles.p] env", "'A'"]),
    ("[profiles.p]\nenv = {\"A=B\" = \"1\"}\n", ["[profiles.p] env", "'A=B'"]),
    ("[profiles.p]\nenv = {\"\" = \"1\"}\n", ["[profiles.p] env"]),
    ("[profiles.p]\nenv = {A = \"a\\u0000b\"}\n", ["[profiles.p] env", "NUL"]),
    ("[profiles.p]\nfunctions = \"search\"\n", ["[profiles.p] functions", "list of strings"]),
    ("[profiles.p]\nfunctions = [\"not-an-identifier\"]\n", ["[profiles.p] functions", "identifier"]),
    ("[profiles.p]\nfunctions = [\"_private\"]\n", ["[profiles.p] functions", "identifier"]),
    ("[profiles.p]\ntimeout = \"5 seconds\"\n", ["[profiles.p] timeout", "not a duration"]),
    ("[profiles.p]\nmemory = true\n", ["[profiles.p] memory"]),
    ("[profiles.p]\nmax_output = \"lots\"\n", ["[profiles.p] max_output"]),
    ("[profiles.p]\nmax_file_size = 0\n", ["[profiles.p] max_file_size"]),
]


@pytest.mark.parametrize(("body", "fragments"), BAD, ids=[body.splitlines()[-1][:40] for body, _ in BAD])
def test_bad_config_names_file_table_and_key(tree: Tree, body: str, fragments: list[str]) -> None:
    path = tree.config(body)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(("value", "expected"), [
    ('"65534:65534"', (65534, 65534)),
    ('"65534"', (65534, 65534)),
    ('"1000:100"', (1000, 100)),
    ("1000", (1000, 1000)),
    ('"4294967294"', (4294967294, 4294967294)),
])
def test_run_as(tree: Tree, value: str, expected: tuple[int, int]) -> None:
    assert tree.load(f"[pool]\nrun_as = {value}\n").pool.run_as == expected


@pytest.mark.parametrize(("value", "seconds"), [('"15m"', 900.0), ('"90s"', 90.0), ("30", 30.0),
                                                 ("2.5", 2.5), ('"1h"', 3600.0), ('"500ms"', 0.5)])
def test_session_idle_units(tree: Tree, value: str, seconds: float) -> None:
    assert tree.load(f"[pool]\nsession_idle = {value}\n").pool.session_idle == seconds


def test_interrupt_grace_and_strict_session_reopen(tree: Tree) -> None:
    assert (PoolSettings().interrupt_grace, PoolSettings().strict_session_reopen) == (1.0, False)
    pool = tree.load('[pool]\ninterrupt_grace = "250ms"\nstrict_session_reopen = true\n').pool
    assert (pool.interrupt_grace, pool.strict_session_reopen) == (0.25, True)


def test_prepared_children(tree: Tree) -> None:
    assert PoolSettings().prepared_children == 2
    assert tree.load("[pool]\nprepared_children = 0\n").pool.prepared_children == 0  # none ahead
    assert tree.load("[pool]\nprepared_children = 8\n").pool.prepared_children == 8


def test_limit_units_are_parsed_once_to_numbers(tree: Tree) -> None:
    config = tree.ceiling('timeout = 90\nmemory = "512mb"\nmax_output = "64k"\nmax_file_size = 4096\n')
    assert config.limits is not None
    assert (config.limits.timeout, config.limits.memory, config.limits.max_output,
            config.limits.max_file_size) == (90.0, 512 << 20, 64 << 10, 4096)


def test_profiles_accept_every_grant_field_and_store_parsed_values(tree: Tree) -> None:
    config = tree.load(f"""
        [profiles.full]
        allow_read = ["{tree.data}", "{tree.data}"]
        allow_write = ["../srv/work"]
        allow_network = false
        env = {{LANG = "C.UTF-8", KEY = "value"}}
        timeout = "5s"
        memory = "256m"
        max_output = "64k"
        max_file_size = 1024
        package_dirs = ["{tree.data}"]
        functions = ["search", "fetch", "search"]
    """)
    profile = config.profiles["full"]
    assert profile == Request(allow_read=[str(tree.data)], allow_write=[str(tree.work)], allow_network=False,
                              env={"LANG": "C.UTF-8", "KEY": "value"}, timeout=5.0, memory=256 << 20,
                              max_output=64 << 10, max_file_size=1024, package_dirs=[str(tree.data)],
                              functions=["search", "fetch"])


def test_profile_paths_need_not_exist_yet(tree: Tree) -> None:
    config = tree.load('[profiles.later]\nallow_write = ["../srv/work/today"]\n')
    assert config.profiles["later"].allow_write == [str(tree.work / "today")]


# --- loading: the file may not lie beneath its own write grants -------------------------------------


def test_config_inside_a_limits_write_grant_is_refused(tree: Tree) -> None:
    path = tree.config(f'[pool.limits]\nallow_write = ["{tree.work}"]\n', where=tree.work)
    with pytest.raises(ConfigError, match="a job could rewrite its own ceiling") as info:
        load_config(path)
    assert "[pool.limits] allow_write" in str(info.value)


def test_config_deeper_inside_a_write_grant_is_refused(tree: Tree) -> None:
    (tree.work / "conf" / "d").mkdir(parents=True)
    path = tree.config(f'[pool.limits]\nallow_write = ["{tree.root / "srv"}"]\n',
                       where=tree.work / "conf" / "d")
    with pytest.raises(ConfigError, match="rewrite its own ceiling"):
        load_config(path)


def test_write_grant_that_is_the_config_file_itself_is_refused(tree: Tree) -> None:
    path = tree.config('[pool.limits]\nallow_write = ["pynox.toml"]\n')
    with pytest.raises(ConfigError, match="rewrite its own ceiling"):
        load_config(path)


def test_relative_write_grant_of_the_config_directory_is_refused(tree: Tree) -> None:
    path = tree.config('[pool.limits]\nallow_write = ["."]\n')
    with pytest.raises(ConfigError, match="rewrite its own ceiling"):
        load_config(path)


def test_config_inside_a_profile_write_grant_is_refused_naming_the_profile(tree: Tree) -> None:
    path = tree.config('[profiles.scratch]\nallow_write = ["."]\n')
    with pytest.raises(ConfigError, match=r"\[profiles.scratch\] allow_write: .*rewrite its own ceiling"):
        load_config(path)


def test_config_reached_through_a_symlink_into_a_write_grant_is_refused(tree: Tree) -> None:
    real = tree.config(f'[pool.limits]\nallow_write = ["{tree.work}"]\n', where=tree.work)
    link = tree.etc / "pynox.toml"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="rewrite its own ceiling"):
        load_config(link)


def test_config_symlink_in_a_writable_directory_is_refused(tree: Tree) -> None:
    # The target is safe, but a job could replace the link itself.
    real = tree.config(f'[pool.limits]\nallow_write = ["{tree.work}"]\n')
    link = tree.work / "pynox.toml"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="rewrite its own ceiling"):
        load_config(link)


def test_config_in_a_sibling_with_a_shared_prefix_is_not_beneath(tree: Tree) -> None:
    path = tree.config(f'[pool.limits]\nallow_write = ["{tree.data}"]\n', where=tree.data2)
    assert load_config(path).limits is not None


def test_config_beneath_a_read_grant_is_fine(tree: Tree) -> None:
    path = tree.config(f'[pool.limits]\nallow_read = ["{tree.data}"]\n', where=tree.data)
    assert load_config(path).limits is not None


# --- loading: a profile above the ceiling is loaded, warned about, and refused per request ------------


@pytest.mark.parametrize(("profile", "fragment"), [
    ('allow_read = ["/etc"]', "allow_read: /etc is outside"),
    ('allow_read = ["../srv/data2"]', "allow_read: "),
    ('allow_write = ["../srv/data"]', "allow_write: "),
    ('package_dirs = ["../outside"]', "package_dirs: "),
    ("allow_network = true", "allow_network"),
    ('timeout = "31s"', "timeout: 31s exceeds the [pool.limits] ceiling of 30s"),
    ('memory = "2g"', "memory: 2g exceeds the [pool.limits] ceiling of 1g"),
    ("max_output = 1048577", "max_output"),
    ('max_file_size = "1g"', "max_file_size: 1g exceeds the [pool.limits] ceiling of 256m"),
])
def test_a_profile_outside_the_ceiling_is_a_warning_and_refused_per_request(tree: Tree, profile: str,
                                                                            fragment: str) -> None:
    path = tree.config(f"""
        [pool.limits]
        allow_read = ["{tree.data}"]
        allow_write = ["{tree.work}"]
        timeout = "30s"
        memory = "1g"
        max_output = "1m"
        max_file_size = "256m"

        [profiles.ok]
        allow_read = ["../srv/data"]

        [profiles.greedy]
        {profile}
    """)
    config = load_config(path)  # the ceiling applies to each request: the file itself is fine
    assert sorted(config.profiles) == ["greedy", "ok"]
    (warning,) = config.warnings
    assert warning.startswith(f"{path}: [profiles.greedy] does not fit under [pool.limits]"), warning
    assert fragment in warning, warning
    with pytest.raises(RequestError) as info:
        config.apply(Request(code="pass", profile="greedy"), str(tree.root))
    assert fragment in str(info.value), info.value
    config.apply(Request(code="pass", profile="ok"), str(tree.root))


def test_the_command_lines_permissions_table_is_ignored_by_the_pool_with_a_warning(tree: Tree) -> None:
    config = tree.load("[permissions]\nallow_read = []\n")
    assert len(config.warnings) == 1 and "[permissions]" in config.warnings[0]
    assert "does not apply to the pool" in config.warnings[0]


def test_profiles_inside_the_ceiling_load(tree: Tree) -> None:
    config = tree.load(f"""
        [pool.limits]
        allow_read = ["{tree.data}"]
        allow_write = ["{tree.work}"]
        allow_network = true
        timeout = "30s"
        [profiles.analysis]
        allow_read = ["../srv/data/sub", "../srv/work"]
        allow_write = ["../srv/work/out"]
        allow_network = true
        timeout = "30s"
    """)
    assert set(config.profiles) == {"analysis"}


def test_without_limits_profiles_are_not_constrained(tree: Tree) -> None:
    config = tree.load('[profiles.wide]\nallow_read = ["/"]\nallow_network = true\ntimeout = "168h"\n')
    assert config.profiles["wide"].allow_read == ["/"]


# --- apply: merging a profile under the request ---------------------------------------------------


def test_profile_lists_come_first_then_the_request_deduplicated(tree: Tree) -> None:
    config = tree.load(f"""
        [profiles.p]
        allow_read = ["{tree.data}", "{tree.data2}"]
        allow_write = ["{tree.work}"]
        package_dirs = ["{tree.data}"]
        functions = ["search", "fetch"]
    """)
    request = run(profile="p", allow_read=[str(tree.outside), str(tree.data)],
                  allow_write=[str(tree.outside)], functions=["fetch", "store"])
    merged = config.apply(request, str(tree.root))
    assert merged.allow_read == [str(tree.data), str(tree.data2), str(tree.outside)]
    assert merged.allow_write == [str(tree.work), str(tree.outside)]
    assert merged.package_dirs == [str(tree.data)]
    assert merged.functions == ["search", "fetch", "store"]
    assert merged.profile is None
    assert merged.code == "print(1)"


def test_profile_env_merges_with_the_request_winning(tree: Tree) -> None:
    config = tree.load('[profiles.p]\nenv = {A = "profile", B = "profile"}\n')
    merged = config.apply(run(profile="p", env={"B": "request", "C": "request"}), str(tree.root))
    assert merged.env == {"A": "profile", "B": "request", "C": "request"}
    assert config.apply(run(profile="p"), str(tree.root)).env == {"A": "profile", "B": "profile"}


def test_profile_scalars_apply_only_where_the_request_sets_none(tree: Tree) -> None:
    config = tree.load("""
        [profiles.p]
        allow_network = true
        timeout = "5s"
        memory = "256m"
        max_output = "64k"
        max_file_size = "1m"
    """)
    inherited = config.apply(run(profile="p"), str(tree.root))
    assert (inherited.allow_network, inherited.timeout, inherited.memory, inherited.max_output,
            inherited.max_file_size) == (True, 5.0, 256 << 20, 64 << 10, 1 << 20)
    own = config.apply(run(profile="p", allow_network=False, timeout="9s", memory=1000, max_output="1k",
                           max_file_size=7, name="mine.py"), str(tree.root))
    assert (own.allow_network, own.timeout, own.memory, own.max_output, own.max_file_size,
            own.name) == (False, "9s", 1000, "1k", 7, "mine.py")


def test_request_fields_the_profile_lacks_are_kept(tree: Tree) -> None:
    config = tree.load('[profiles.p]\nallow_network = true\n')
    request = run(profile="p", allow_read=["x"], env={"K": "v"}, args=["a"], name="n.py", id="t-1")
    merged = config.apply(request, str(tree.root))
    assert merged == msgspec.structs.replace(request, profile=None, allow_network=True)


def test_apply_does_not_mutate_the_request_or_the_profile(tree: Tree) -> None:
    config = tree.load(f'[profiles.p]\nallow_read = ["{tree.data}"]\nenv = {{A = "1"}}\n')
    request = run(profile="p", allow_read=[str(tree.data2)], env={"B": "2"})
    before = msgspec.structs.replace(request)
    merged = config.apply(request, str(tree.root))
    merged.allow_read.append("/x")  # type: ignore[union-attr]
    merged.env["C"] = "3"  # type: ignore[index]
    assert request == before
    assert config.profiles["p"].allow_read == [str(tree.data)]
    assert config.profiles["p"].env == {"A": "1"}


def test_unknown_profile_names_the_known_ones(tree: Tree) -> None:
    config = tree.load("[profiles.analysis]\n[profiles.fetch]\n")
    with pytest.raises(RequestError, match=r"'nope'.*known: analysis, fetch"):
        config.apply(run(profile="nope"), str(tree.root))


def test_a_profile_with_no_profiles_configured(tree: Tree) -> None:
    with pytest.raises(RequestError, match="none are configured"):
        EMPTY.apply(run(profile="analysis"), str(tree.root))
    with pytest.raises(RequestError, match="none are configured"):
        tree.load("").apply(run(profile="analysis"), str(tree.root))


def test_without_a_profile_and_without_limits_the_request_is_unchanged(tree: Tree) -> None:
    config = tree.load("[profiles.p]\nallow_network = true\n")
    request = run(allow_read=["anything"], timeout="1h")
    assert config.apply(request, str(tree.root)) == request


def test_the_profile_is_merged_before_the_ceiling(tree: Tree) -> None:
    config = tree.load(f"""
        [pool.limits]
        allow_read = ["{tree.data}"]
        timeout = "30s"
        [profiles.p]
        allow_read = ["{tree.data}"]
        timeout = "20s"
    """)
    assert config.apply(run(profile="p"), str(tree.root)).timeout == 20.0
    with pytest.raises(RequestError, match=r"allow_read: .*outside"):
        config.apply(run(profile="p", allow_read=[str(tree.outside)]), str(tree.root))
    with pytest.raises(RequestError, match="timeout: 40s exceeds"):
        config.apply(run(profile="p", timeout="40s"), str(tree.root))


# --- apply: the ceiling on paths -------------------------------------------------------------------


def test_exact_refusal_message(tree: Tree) -> None:
    config = tree.ceiling()
    with pytest.raises(RequestError) as info:
        config.apply(run(allow_read=["/etc"]), str(tree.root))
    assert str(info.value) == (f"allow_read: /etc is outside the [pool.limits] ceiling "
                               f"(allowed: {tree.data}, {tree.work})")


@pytest.mark.parametrize("field", ["allow_read", "package_dirs"])
def test_read_paths_beneath_a_read_or_write_grant_pass(tree: Tree, field: str) -> None:
    (tree.data / "sub" / "deeper").mkdir(parents=True)
    config = tree.ceiling()
    inside = [str(tree.data), str(tree.data / "sub" / "deeper"), str(tree.work), "srv/data/sub", "srv/work"]
    for path in inside:
        request = run(**{field: [path]})
        assert config.apply(request, str(tree.root)) == request


@pytest.mark.parametrize("field", ["allow_read", "package_dirs"])
@pytest.mark.parametrize("path", ["/", "/etc", "outside", "srv", "srv/data2", "srv/data/../data2",
                                  "srv/data/../../outside", "srv/data/sub/../../data2"])
def test_read_paths_outside_are_refused(tree: Tree, field: str, path: str) -> None:
    pattern = rf"^{field}: .* is outside the \[pool.limits\] ceiling \(allowed: "
    with pytest.raises(RequestError, match=pattern):
        tree.ceiling().apply(run(**{field: [str(tree.data), path]}), str(tree.root))


def test_a_sibling_sharing_a_name_prefix_is_not_beneath(tree: Tree) -> None:
    config = tree.ceiling()
    with pytest.raises(RequestError, match="srv/data2 is outside"):
        config.apply(run(allow_read=[str(tree.data2)]), str(tree.root))
    with pytest.raises(RequestError, match="srv/work2 is outside"):
        config.apply(run(allow_write=[str(tree.root / "srv" / "work2")]), str(tree.root))


def test_a_symlink_inside_the_ceiling_cannot_dodge_it(tree: Tree) -> None:
    (tree.data / "escape").symlink_to(tree.outside)
    (tree.work / "escape").symlink_to(tree.outside)
    config = tree.ceiling()
    with pytest.raises(RequestError, match=r"srv/data/escape \(resolves to .*/outside\) is outside"):
        config.apply(run(allow_read=["srv/data/escape"]), str(tree.root))
    with pytest.raises(RequestError, match=r"allow_write: .*resolves to .*/outside"):
        config.apply(run(allow_write=["srv/work/escape"]), str(tree.root))


def test_a_symlink_into_the_ceiling_is_allowed(tree: Tree) -> None:
    (tree.outside / "in").symlink_to(tree.data)
    request = run(allow_read=["outside/in"])
    assert tree.ceiling().apply(request, str(tree.root)) == request


def test_relative_paths_are_resolved_against_the_given_cwd(tree: Tree) -> None:
    config = tree.ceiling()
    request = run(allow_read=["."], allow_write=["../work"])
    assert config.apply(request, str(tree.data)) == request
    with pytest.raises(RequestError, match=r"^allow_read: \. \(resolves to"):
        config.apply(request, str(tree.outside))


def test_home_in_a_request_path_is_judged_as_the_job_would_grant_it(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory literally named "~" inside data must not smuggle $HOME past the ceiling.
    (tree.data / "~" / "x").mkdir(parents=True)
    (tree.outside / "x").mkdir()
    monkeypatch.setenv("HOME", str(tree.outside))
    with pytest.raises(RequestError, match=r"~/x \(resolves to .*outside/x\) is outside"):
        tree.ceiling().apply(run(allow_read=["~/x"]), str(tree.data))


def test_writes_must_lie_beneath_a_write_grant(tree: Tree) -> None:
    config = tree.ceiling()
    request = run(allow_write=[str(tree.work), "srv/work/new-file"])
    assert config.apply(request, str(tree.root)) == request
    with pytest.raises(RequestError) as info:
        config.apply(run(allow_write=[str(tree.data)]), str(tree.root))
    assert str(info.value) == (f"allow_write: {tree.data} is outside the [pool.limits] ceiling "
                               f"(allowed: {tree.work})")


def test_the_script_must_be_readable_under_the_ceiling(tree: Tree) -> None:
    (tree.data / "app.py").write_text("print(1)\n")
    (tree.outside / "app.py").write_text("print(1)\n")
    config = tree.ceiling()
    request = Request(script="srv/data/app.py")
    assert config.apply(request, str(tree.root)) == request
    with pytest.raises(RequestError, match=r"^script: outside/app.py \(resolves to .*/app.py\) is outside"):
        config.apply(Request(script="outside/app.py"), str(tree.root))


@pytest.mark.parametrize("path", ["", "a\0b"])
def test_a_path_that_is_not_a_path_is_refused(tree: Tree, path: str) -> None:
    with pytest.raises(RequestError, match="is not a path"):
        tree.ceiling().apply(run(allow_read=[path]), str(tree.root))


def test_limits_without_allow_write_allow_no_writes(tree: Tree) -> None:
    config = tree.load(f'[pool.limits]\nallow_read = ["{tree.data}"]\n')
    assert config.limits is not None and config.limits.allow_write == ()
    with pytest.raises(RequestError, match=r"^allow_write: .*data is outside .* \(allowed: none\)$"):
        config.apply(run(allow_write=[str(tree.data)]), str(tree.root))


def test_limits_without_allow_read_still_let_jobs_read_where_they_may_write(tree: Tree) -> None:
    config = tree.load(f'[pool.limits]\nallow_write = ["{tree.work}"]\n')
    assert config.limits is not None and config.limits.allow_read == ()
    request = run(allow_read=[str(tree.work)], allow_write=[str(tree.work)])
    assert config.apply(request, str(tree.root)) == request
    with pytest.raises(RequestError, match=rf"^allow_read: .*data is outside .*\(allowed: {tree.work}\)$"):
        config.apply(run(allow_read=[str(tree.data)]), str(tree.root))


def test_an_empty_limits_table_allows_no_paths_and_no_network(tree: Tree) -> None:
    config = tree.load("[pool.limits]\n")
    assert config.limits == Limits()
    assert config.apply(run(), str(tree.root)) == run()
    for request in (run(allow_read=["/"]), run(allow_write=["/tmp"]), run(package_dirs=["/usr"]),
                    Request(script="/etc/hostname")):
        with pytest.raises(RequestError, match=r"\(allowed: none\)"):
            config.apply(request, str(tree.root))
    with pytest.raises(RequestError, match="allow_network"):
        config.apply(run(allow_network=True), str(tree.root))


# --- apply: the ceiling on network and numbers ------------------------------------------------------


def test_network_needs_the_limits_to_allow_it(tree: Tree) -> None:
    denied = tree.ceiling()
    with pytest.raises(RequestError, match=r"^allow_network: the \[pool.limits\] ceiling does not allow"):
        denied.apply(run(allow_network=True), str(tree.root))
    assert denied.apply(run(allow_network=False), str(tree.root)).allow_network is False
    assert tree.ceiling("allow_network = true").apply(run(allow_network=True), str(tree.root)).allow_network


@pytest.mark.parametrize(("field", "limit", "over", "at", "message"), [
    ("timeout", '"30s"', "30.5s", "30s", "timeout: 30.5s exceeds the [pool.limits] ceiling of 30s"),
    ("timeout", '"30s"', 31, 30, "timeout: 31s exceeds the [pool.limits] ceiling of 30s"),
    ("timeout", '"500ms"', "501ms", 0.5, "timeout: 501ms exceeds the [pool.limits] ceiling of 500ms"),
    ("timeout", '"30s"', 30.000001, "0.5m", "timeout: 30.000001s exceeds the [pool.limits] ceiling of 30s"),
    ("memory", '"1g"', "1025m", "1024m", "memory: 1025m exceeds the [pool.limits] ceiling of 1g"),
    ("memory", '"1g"', (1 << 30) + 1, 1 << 30, f"memory: {(1 << 30) + 1} bytes exceeds"),
    ("max_output", "1048576", "2m", "1m", "max_output: 2m exceeds the [pool.limits] ceiling of 1m"),
    ("max_file_size", '"256m"', "1g", "256mb", "max_file_size: 1g exceeds the [pool.limits] ceiling of 256m"),
])
def test_numbers_may_not_exceed_the_limit(
    tree: Tree, field: str, limit: str, over: str | int | float, at: str | int | float, message: str
) -> None:
    config = tree.ceiling(f"{field} = {limit}")
    with pytest.raises(RequestError) as info:
        config.apply(run(**{field: over}), str(tree.root))
    assert str(info.value).startswith(message), str(info.value)
    assert getattr(config.apply(run(**{field: at}), str(tree.root)), field) == at


@pytest.mark.parametrize(("field", "value"), [("timeout", "5 parsecs"), ("timeout", "0s"), ("timeout", True),
                                              ("memory", "lots"), ("memory", -1), ("max_output", 0.5),
                                              ("max_file_size", "1t"), ("timeout", 10 ** 400),
                                              ("memory", "9" * 400)])
def test_a_bad_unit_in_a_request_is_a_request_error(tree: Tree, field: str, value: object) -> None:
    with pytest.raises(RequestError, match=f"^{field}: "):
        tree.ceiling().apply(run(**{field: value}), str(tree.root))


def test_unset_limits_get_the_ceiling_when_the_default_would_exceed_it(tree: Tree) -> None:
    assert DEFAULTS.timeout > 10 and DEFAULTS.memory > 256 << 20 and DEFAULTS.max_output > 64 << 10
    config = tree.ceiling('timeout = "10s"\nmemory = "256m"\nmax_output = "64k"\n')
    applied = config.apply(run(), str(tree.root))
    assert (applied.timeout, applied.memory, applied.max_output) == (10.0, 256 << 20, 64 << 10)
    assert applied.max_file_size is None


def test_unset_limits_keep_the_default_when_it_fits(tree: Tree) -> None:
    config = tree.ceiling(f"timeout = {DEFAULTS.timeout}\nmemory = \"4g\"\nmax_output = \"1g\"\n")
    applied = config.apply(run(), str(tree.root))
    assert (applied.timeout, applied.memory, applied.max_output) == (None, None, None)


def test_a_max_file_size_limit_applies_to_requests_that_set_none(tree: Tree) -> None:
    config = tree.ceiling('max_file_size = "1g"')
    assert config.apply(run(), str(tree.root)).max_file_size == 1 << 30
    assert config.apply(run(max_file_size="1m"), str(tree.root)).max_file_size == "1m"


def test_apply_then_to_job_enforces_the_filled_in_limits(tree: Tree) -> None:
    config = tree.ceiling('timeout = "2s"\nmemory = "128m"\nmax_output = "4k"\nmax_file_size = "1m"\n')
    spec, max_output = to_job(config.apply(run(allow_read=["srv/data"]), str(tree.root)),
                              cwd=str(tree.root), runtime_paths=[])
    confinement = spec.confinement
    assert (confinement.timeout, confinement.memory, confinement.max_file_size, max_output) == (2.0, 128 << 20, 1 << 20,
                                                                                                4 << 10)
    assert confinement.allow_read == [str(tree.data)]


def test_the_ceiling_is_checked_at_apply_time_not_only_at_load(tree: Tree) -> None:
    # A path that was inside the ceiling when the file loaded can be re-pointed later.
    (tree.data / "moving").symlink_to(tree.data / "..")
    config = tree.ceiling()
    with pytest.raises(RequestError, match="moving"):
        config.apply(run(allow_read=["srv/data/moving"]), str(tree.root))
    (tree.data / "moving").unlink()
    (tree.data / "moving").mkdir()
    request = run(allow_read=["srv/data/moving"])
    assert config.apply(request, str(tree.root)) == request


# The Landlock ABI cap: [pool] landlock_abi, the pool's --landlock-abi, $PYNOX_LANDLOCK_ABI -----------


@pytest.mark.pure
def test_landlock_abi_in_the_file(tree: Tree) -> None:
    assert tree.load("[pool]\nlandlock_abi = 3\n").pool.landlock_abi == 3
    assert tree.load("[pool]\nworkers = 1\n").pool.landlock_abi is None


@pytest.mark.pure
@pytest.mark.parametrize("value", ["0", "-2", '"3"', "true", "2.5"])
def test_a_bad_landlock_abi_names_file_table_and_key(tree: Tree, value: str) -> None:
    path = tree.config(f"[pool]\nlandlock_abi = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: [pool] landlock_abi: "), info.value


@pytest.mark.pure
def test_the_command_line_wins_over_the_file_which_wins_over_the_environment(
        tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tree.config("[pool]\nlandlock_abi = 3\n")
    monkeypatch.setenv(LANDLOCK_ABI_VARIABLE, "5")
    parser = build_parser()
    assert pool_options(parser.parse_args(["pool", "--config", str(path), "--landlock-abi", "2"])).landlock_abi == 2
    assert pool_options(parser.parse_args(["pool", "--config", str(path)])).landlock_abi == 3
    assert pool_options(parser.parse_args(["pool"])).landlock_abi == 5
    monkeypatch.setenv(LANDLOCK_ABI_VARIABLE, "none")
    with pytest.raises(ConfigError, match=r"^\$PYNOX_LANDLOCK_ABI must be a Landlock ABI number"):
        pool_options(parser.parse_args(["pool"]))
    with pytest.raises(ConfigError, match=r"^--landlock-abi must be at least 1"):
        pool_options(parser.parse_args(["pool", "--landlock-abi", "0"]))


# --- limits the runtime cannot meet, and errors that name the file's own key ------------------------


@pytest.mark.parametrize("memory", ['"10m"', '"512"', "512", '"31m"'])
@pytest.mark.parametrize("table", ["pool.limits", "profiles.small"])
def test_a_memory_limit_no_job_can_start_under_is_refused_naming_file_table_and_key(
        tree: Tree, table: str, memory: str) -> None:
    with pytest.raises(ConfigError) as caught:
        tree.load(f"[{table}]\nmemory = {memory}\n")
    message = str(caught.value)
    assert message.startswith(f"{tree.etc / 'pynox.toml'}: [{table}] memory: "), message
    assert "SandboxSetupError" in message and "32m" in message


def test_a_memory_limit_a_job_can_start_under_loads(tree: Tree) -> None:
    assert tree.load('[pool.limits]\nmemory = "32m"\n').limits == Limits(memory=32 << 20)


def test_too_many_workers_in_the_file_names_the_files_key_not_a_flag(tree: Tree) -> None:
    with pytest.raises(ConfigError) as caught:
        tree.load("[pool]\nworkers = 1000\n")
    message = str(caught.value)
    assert "[pool] workers" in message and "--workers" not in message and "256" in message
    # The flag itself is still named as the flag.
    with pytest.raises(ConfigError, match="--workers"):
        pool_options(build_parser().parse_args(["pool", "--workers=1000"]))


@pytest.mark.pure
def test_run_as_takes_a_user_name(tmp_path: Path) -> None:
    """A name is looked up when the file is read: the user's uid and primary group, or the group named."""
    import grp
    import pwd

    nobody = pwd.getpwnam("nobody")
    (tmp_path / "a.toml").write_text('[pool]\nrun_as = "nobody"\n')
    assert load_config(tmp_path / "a.toml").pool.run_as == (nobody.pw_uid, nobody.pw_gid)
    group = grp.getgrgid(nobody.pw_gid).gr_name
    (tmp_path / "b.toml").write_text(f'[pool]\nrun_as = "{nobody.pw_uid}:{group}"\n')
    assert load_config(tmp_path / "b.toml").pool.run_as == (nobody.pw_uid, nobody.pw_gid)
    (tmp_path / "c.toml").write_text('[tenants.ci]\nuids = [1001]\nrun_as = "nobody"\nmax_jobs = 2\n')
    [tenant] = load_config(tmp_path / "c.toml").tenants
    assert (tenant.name, tenant.run_as, tenant.max_jobs, tenant.uids) == ("ci", (nobody.pw_uid, nobody.pw_gid), 2,
                                                                         frozenset({1001}))
    (tmp_path / "d.toml").write_text('[pool]\nrun_as = "1:1"\n\n[profiles.low]\nrun_as = "nobody"\n\n[profiles.x]\n')
    config = load_config(tmp_path / "d.toml")
    assert config.profile_run_as == {"low": (nobody.pw_uid, nobody.pw_gid)}
    assert (config.run_as("low"), config.run_as("x"), config.run_as(None)) == ((nobody.pw_uid, nobody.pw_gid),
                                                                              (1, 1), (1, 1))
    assert config.run_as("low", (5, 5)) == (5, 5)  # a tenant's own is over both
    (tmp_path / "e.toml").write_text('[profiles.low]\nrun_as = "no-such-user-here"\n')
    with pytest.raises(ConfigError, match=r"\[profiles.low\].*run_as.*no such user"):
        load_config(tmp_path / "e.toml")
def test_a_session_key_file_a_job_could_read_is_refused(tree: Tree) -> None:
    key = tree.data / "state.key"
    key.write_bytes(b"k" * 32)
    with pytest.raises(ConfigError, match=r"\[pool.limits\] allow_read: .*contains the session_key_file"):
        load_config(tree.config(f'[pool]\nsession_key_file = "{key}"\n[pool.limits]\nallow_read = ["{tree.data}"]\n'))
    with pytest.raises(ConfigError, match=r"\[profiles.p\] allow_read: .*a job could read the key"):
        load_config(tree.config(f'[pool]\nsession_key_file = "{key}"\n[profiles.p]\nallow_write = ["{tree.data}"]\n'))
    # Control: outside every grant, the key file is taken; so is a cap within one protocol line.
    outside = tree.outside / "state.key"
    outside.write_bytes(b"k" * 32)
    config = load_config(tree.config(f'[pool]\nsession_key_file = "{outside}"\nmax_session_state = "100k"\n'
                                     f'[pool.limits]\nallow_read = ["{tree.data}"]\n'))
    assert config.pool.session_key_file == str(outside) and config.pool.max_session_state == 100 << 10
    with pytest.raises(ConfigError, match="max_session_state: must be between 1 byte and 720k"):
        load_config(tree.config('[pool]\nmax_session_state = "1m"\n'))


@pytest.mark.pure
@pytest.mark.parametrize(("body", "fragment"), [
    ('memory_budget = "16m"', r"memory_budget: 16m is below the 32m one Python job needs"),
    ('memory_budget = "100m"', r"memory_budget: 100m is below the 256m one of its jobs may take \(\[pool.limits\] "
                               r"memory\)"),
    ('memory_budget = "lots"', r"memory_budget: "),
    ('memory_budget = true', r"memory_budget: "),
    ("cpu_weight = 0", r"cpu_weight: must be from 1 to 10000"),
    ("cpu_weight = 10001", r"cpu_weight: must be from 1 to 10000"),
    ('cpu_weight = "high"', r"cpu_weight: expected a weight from 1 to 10000"),
    ("cpu_weight = 1.5", r"cpu_weight: expected a weight"),
])
def test_a_tenant_budget_is_checked_against_the_operators_own_limits(tmp_path: Path, body: str,
                                                                    fragment: str) -> None:
    """A budget below what one of the tenant's jobs may take (the ceiling's memory, a profile's it may name)
    would kill a single job at the budget instead of its own limit: refused, naming file, table and key."""
    path = tmp_path / "pynox.toml"
    path.write_text(f'[pool.limits]\nmemory = "256m"\n\n[profiles.big]\nmemory = "192m"\n\n'
                    f"[tenants.ci]\nuids = [1001]\n{body}\n")
    with pytest.raises(ConfigError, match=rf"{path}: \[tenants.ci\] {fragment}"):
        load_config(path)


@pytest.mark.pure
def test_a_tenant_budget_at_or_above_its_jobs_limits_loads(tmp_path: Path) -> None:
    path = tmp_path / "pynox.toml"
    path.write_text('[pool.limits]\nmemory = "256m"\n\n[profiles.big]\nmemory = "512m"\n\n[profiles.small]\n'
                    'memory = "64m"\n\n[tenants.ci]\nuids = [1001]\nmemory_budget = "300m"\nprofiles = ["small"]\n'
                    "cpu_weight = 50\n\n[tenants.ops]\nuids = [0]\n")
    ci, ops = load_config(path).tenants
    assert (ci.memory_budget, ci.cpu_weight, ci.has_budget) == (300 << 20, 50, True)
    assert (ops.memory_budget, ops.cpu_weight, ops.has_budget) == (None, None, False)
    # No ceiling on memory: the default a job gets when it names none (1g) is the bound.
    path.write_text('[tenants.ci]\nuids = [1001]\nmemory_budget = "512m"\n')
    with pytest.raises(ConfigError, match=r"below the 1g one of its jobs may take \(the default memory\)"):
        load_config(path)
    path.write_text('[profiles.big]\nmemory = "2g"\n\n[tenants.ci]\nuids = [1001]\nmemory_budget = "1g"\n')
    with pytest.raises(ConfigError, match=r"memory_budget: 1g is below the 2g one of its jobs may take "
                                          r"\(\[profiles.big\] memory\)"):
        load_config(path)
