"""pynox.hosts: allow_hosts entries, the ceiling over them and the allow-list the pool decides by.

Pure tests of the rules' logic; what the kernel and the pool make of them is proven from outside in
tests/sandbox/test_allow_hosts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pynox.errors import ConfigError, RequestError
from pynox.hosts import AllowList, parse_entry, parse_hosts, within
from pynox.protocol import Request
from tests.config_tree import Tree, make_tree

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(("entry", "entries"), [
    ("index.example.com", ["index.example.com:80", "index.example.com:443"]),
    ("Index.Example.com.:8443", ["index.example.com:8443"]),
    ("10.1.2.3", ["10.1.2.3:80", "10.1.2.3:443"]),
    ("10.0.0.0/8:5432", ["10.0.0.0/8:5432"]),
    ("::1", ["[::1]:80", "[::1]:443"]),
    ("[2001:db8::/32]:443", ["[2001:db8::/32]:443"]),
])
def test_entries_parse_to_one_port_each(entry: str, entries: list[str]) -> None:
    assert parse_entry(entry).entries() == entries


@pytest.mark.parametrize("bad", ["", "a..b", "1.2.3", "10.1.2.3/16", "host:0", "host:65536", "host:http", "[::1]",
                                 "[10.0.0.1]:80", "-a.com", "a b", "x" * 301, "::1:80x"])
def test_bad_entries_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_entry(bad)
    assert repr(bad)[:10] in str(refused.value)


def test_at_most_256_entries() -> None:
    assert len(parse_hosts([f"10.0.{n // 256}.{n % 256}" for n in range(256)])) == 256
    with pytest.raises(ValueError, match="at most 256"):
        parse_hosts([f"10.0.{n // 256}.{n % 256}" for n in range(257)])


def test_the_allow_list_decides_by_address_and_port() -> None:
    allowed = AllowList(parse_hosts(["localhost:8080", "10.0.0.0/8:443"]), {"localhost": ["127.0.0.1", "::1"]})
    assert allowed.allows("127.0.0.1", 8080) and allowed.allows("::1", 8080)
    assert allowed.allows("::ffff:127.0.0.1", 8080)  # IPv4-mapped: its IPv4 address
    assert allowed.allows("10.200.0.1", 443)
    assert not allowed.allows("127.0.0.1", 8081)
    assert not allowed.allows("127.0.0.2", 8080)
    assert not allowed.allows("11.0.0.1", 443)
    assert not allowed.allows("169.254.169.254", 80)
    assert allowed.entry_for("127.0.0.1", 22) == "localhost:22"
    assert allowed.entry_for("8.8.8.8", 53) == "8.8.8.8:53"
    assert allowed.entry_for("2001:db8::1", 443) == "[2001:db8::1]:443"


def test_a_name_that_did_not_resolve_allows_nothing() -> None:
    allowed = AllowList(parse_hosts(["nowhere.invalid"]), {"nowhere.invalid": []})
    assert not allowed.allows("127.0.0.1", 443)


def test_within_the_ceiling() -> None:
    ceiling = parse_hosts(["10.0.0.0/8:443", "index.example.com", "[2001:db8::/32]:443"])
    assert within(parse_entry("10.1.0.0/16:443"), ceiling)
    assert within(parse_entry("10.1.2.3:443"), ceiling)
    assert not within(parse_entry("10.1.2.3"), ceiling)  # port 80 is not in the ceiling for it
    assert not within(parse_entry("0.0.0.0/0:443"), ceiling)
    assert within(parse_entry("index.example.com:443"), ceiling) and within(parse_entry("INDEX.example.com"), ceiling)
    assert not within(parse_entry("index.example.com:8080"), ceiling)
    assert not within(parse_entry("files.index.example.com"), ceiling)  # a name within the same name only
    assert within(parse_entry("[2001:db8:1::/48]:443"), ceiling)
    assert not within(parse_entry("[2001:db9::1]:443"), ceiling)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path)


def _request(**fields: object) -> Request:
    return Request(code="print(1)", **fields)  # type: ignore[arg-type]


def test_the_ceiling_bounds_allow_hosts_and_refuses_the_whole_network(tree: Tree) -> None:
    config = tree.load('[pool.limits]\nallow_hosts = ["10.0.0.0/8:443", "index.example.com"]\n')
    cwd = str(tree.root)
    assert config.apply(_request(allow_hosts=["10.9.0.0/16:443", "index.example.com:443"]), cwd).allow_hosts
    with pytest.raises(RequestError, match=r"allow_hosts: 10\.1\.2\.3:80 is not within .*10\.0\.0\.0/8:443"):
        config.apply(_request(allow_hosts=["10.1.2.3:80"]), cwd)
    with pytest.raises(RequestError, match=r"allow_network: the \[pool.limits\] ceiling does not allow"):
        config.apply(_request(allow_network=True), cwd)


def test_a_ceiling_without_allow_hosts_allows_none_unless_it_allows_the_network(tree: Tree) -> None:
    cwd = str(tree.root)
    with pytest.raises(RequestError, match="allowed: none"):
        tree.load("[pool.limits]\ntimeout = \"1m\"\n").apply(_request(allow_hosts=["index.example.com"]), cwd)
    network = tree.load("[pool.limits]\nallow_network = true\n")
    assert network.apply(_request(allow_hosts=["anything.example:22"]), cwd).allow_hosts == ["anything.example:22"]


def test_profiles_merge_hosts_and_a_bad_entry_is_a_config_error(tree: Tree) -> None:
    config = tree.load('[profiles.index]\nallow_hosts = ["Index.Example.com", "files.example.com:443"]\n')
    merged = config.apply(_request(profile="index", allow_hosts=["10.0.0.1:5432"]), str(tree.root))
    assert merged.allow_hosts == ["index.example.com", "files.example.com:443", "10.0.0.1:5432"]
    with pytest.raises(ConfigError, match="allow_hosts"):
        tree.load('[profiles.bad]\nallow_hosts = ["10.1.2.3/16"]\n')
    with pytest.raises(ConfigError, match="allow_hosts"):
        tree.load('[pool.limits]\nallow_hosts = ["host:0"]\n')
