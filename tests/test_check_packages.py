"""``pynox check --config``: whether the pool can install the packages requests name (uv, the index or
wheelhouse the config names), and a config's installer keys refused with file, table and key."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pynox.cli import main
from tests.wheelhouse import make_wheelhouse, pool_config, serve_index

pytestmark = pytest.mark.timeout(120)


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", "--config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_reports_uv_and_the_wheelhouse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    house = make_wheelhouse(tmp_path)
    config = pool_config(tmp_path / "pynox.toml", packages_dir=tmp_path / "packages", find_links=[str(house.dir)],
                         allowed=["tinypkg"])
    code, out, err = _check(config, capsys)
    assert code == 0, err
    assert "packages: uv " in out and "wheels only" in out
    assert f"packages: find_links {house.dir} holds 4 wheels" in out
    assert "requests may name tinypkg" in out


def test_check_reports_a_local_index_that_answers_and_one_that_does_not(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    house = make_wheelhouse(tmp_path)
    with serve_index(house.dir) as url:
        config = pool_config(tmp_path / "up.toml", packages_dir=tmp_path / "packages", index=url)
        code, out, err = _check(config, capsys)
        assert code == 0 and f"packages: package_index {url} answers" in out, err
    with socket.socket() as unused:  # a loopback port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    config = pool_config(tmp_path / "down.toml", packages_dir=tmp_path / "packages",
                         index=f"http://127.0.0.1:{port}/simple")
    code, out, err = _check(config, capsys)
    assert code == 1 and "[pool]: packages: package_index" in err and "does not answer" in err, err


def test_check_refuses_a_missing_uv_and_a_missing_wheelhouse(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    house = make_wheelhouse(tmp_path)
    config = pool_config(tmp_path / "nouv.toml", packages_dir=tmp_path / "packages", find_links=[str(house.dir)],
                         extra_pool=f"uv = {str(tmp_path / 'no-uv-here')!r}")
    code, _, err = _check(config, capsys)
    assert code == 1 and "does not run" in err, err
    config = pool_config(tmp_path / "nohouse.toml", packages_dir=tmp_path / "packages",
                         find_links=[str(tmp_path / "nowhere")])
    code, _, err = _check(config, capsys)
    assert code == 1 and "is not a directory" in err, err
    # The control: a config that names no index says installs are off, and passes.
    config = pool_config(tmp_path / "off.toml", packages_dir=tmp_path / "packages")
    code, out, _ = _check(config, capsys)
    assert code == 0 and "this pool installs none" in out


@pytest.mark.parametrize(("text", "words"), [
    ('[pool.limits]\npackages = ["numpy @ https://example.invalid/x.whl"]\n', ["[pool.limits] packages",
                                                                               "no extras, markers, URLs"]),
    ('[pool.limits]\npackages = "numpy"\n', ["[pool.limits] packages", "a list of strings"]),
    ('[pool]\nmax_installs = 0\n', ["[pool] max_installs", "positive integer"]),
    ('[pool]\ninstall_timeout = "soon"\n', ["[pool] install_timeout"]),
    ('[pool]\nallow_sdist = "yes"\n', ["[pool] allow_sdist", "true or false"]),
    ('[profiles.x]\npackages = ["--index-url=http://127.0.0.1/"]\n', ["[profiles.x] packages"]),
])
def test_a_bad_installer_key_names_the_file_table_and_key(tmp_path: Path, text: str, words: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pynox.toml"
    path.write_text(text)
    code, _, err = _check(path, capsys)
    assert code == 1 and err.startswith(f"pynox check: ConfigError: {path}: "), err
    for word in words:
        assert word in err, err
