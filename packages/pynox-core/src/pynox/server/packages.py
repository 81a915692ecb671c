"""Installing the ``packages`` a request names: by the pool, with uv, never by the job.

A job that names packages waits (in its queue time) while the pool installs them; then the environment
they were installed in is one more of its ``package_dirs``: granted read-only by Landlock and put on its
``sys.path``. The job gets no network and no write access for any of it.

* **From where**: only the index or the wheelhouse (``find_links``) the operator names in ``[pool]``, and
  wheels only unless ``allow_sdist``: building a source distribution runs its code on the host.
* **Into where**: one directory per resolved set, named by the hash of the pinned list uv resolved
  (``<packages_dir>/envs/<hash>``), built beside it and renamed into place when complete, its files made
  read-only. A set asked for again costs a dictionary lookup: the request's set is remembered with the
  environment it resolved to.
* **Bounds**: each install has its own time budget (``install_timeout``), apart from every job's timeout;
  at most ``max_installs`` run at once, and an environment larger than ``max_install_size`` is removed and
  refused. Jobs asking for the same set at the same time share one install.
* **Where it runs**: on a thread of its own per install, never on intake (which goes on reading) or on a
  worker (which goes on running other jobs); the job is queued for a worker once its set is in place.

Every failure is a refusal the model can act on: not allowed (the ceiling, in pynox.grants), not found,
only a source distribution, too large, too slow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from ..config import Installs
from ..errors import RequestError
from ..requirements import Requirement, check_packages, requirements
from ..units import format_duration, format_size
from ..wire.spec import JobSpec

__all__ = ["MAX_WAITING", "Installer", "default_root", "find_uv", "with_environment"]

_log = logging.getLogger(__name__)

MAX_WAITING = 64  # jobs waiting for their sets at once; more are refused (intake's queue is bounded too)


def default_root() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "pynox", "packages")


def find_uv() -> str | None:
    """uv's binary: the ``uv`` package's (``pynox-core[packages]``), else one on PATH."""
    try:
        import uv  # type: ignore[import-not-found, unused-ignore]

        found = str(uv.find_uv_bin())
        return found if os.path.isfile(found) else None
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


@dataclass
class _Install:
    """One set being installed, and every job waiting for it."""

    waiting: list[Callable[[str | None, str | None], None]] = field(default_factory=list)


class Installer:
    """The pool's installs: one per set at a time, ``concurrent`` at once, each within ``timeout``."""

    def __init__(self, settings: Installs, *, ceiling: Sequence[Requirement] = (), python: str = sys.executable,
                 uv: str | None = None, allowed: Sequence[Requirement] | None = None) -> None:
        """``ceiling``: the [pool.limits] packages, whose specifiers bound every install; ``allowed``: the
        names a `%pip install` line may ask for (the same list; None: no [pool.limits] table)."""
        self.settings = settings
        self._allowed = allowed
        self.root = settings.root or default_root()
        self.envs = os.path.join(self.root, "envs")
        self.python = python
        self.uv = uv or settings.uv or find_uv()
        self._ceiling = tuple(ceiling)
        self._lock = threading.Condition()
        self._memo: dict[str, str] = {}  # the key of a request's set -> its environment
        self._pending: dict[str, _Install] = {}
        self._waiting = 0
        self._delivering = 0  # installs whose waiting jobs are being queued (see wait_idle)
        self._slots = threading.BoundedSemaphore(settings.concurrent)
        self.installs = 0  # sets installed by this pool (not found in place)

    # -- what the pool asks --------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why this pool cannot install anything, or None."""
        if not self.settings.enabled:
            return ("this pool installs no packages: its operator named no [pool] package_index or find_links. "
                    "Work with the packages that are installed")
        if self.uv is None:
            return ("this pool cannot install packages: uv is not installed beside it (pip install "
                    "'pynox-core[packages]'); tell its operator")
        return None

    def check(self) -> tuple[list[str], str | None]:
        """What ``pynox check --config`` says of installs: lines to read, and what makes them unusable (or
        None). It runs uv, and reads each find-links directory or asks the index once (5 s at most)."""
        if not self.settings.enabled:
            return ["packages: this pool installs none (no [pool] package_index or find_links)"], None
        if self.uv is None:
            return [], ("packages: uv is not installed (pip install 'pynox-core[packages]', or name it in "
                        "[pool] uv), so no package can be installed")
        try:
            version = subprocess.run([self.uv, "--version"], capture_output=True, text=True, timeout=10,
                                     check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            return [], f"packages: uv at {self.uv} does not run: {exc}"
        lines = [f"packages: {version} at {self.uv}; environments in {self.envs}; wheels "
                 f"{'and source distributions (their code runs on the host)' if self.settings.sdist else 'only'}"]
        for link in self.settings.find_links:
            if "://" in link:
                problem = _reachable(link)
                if problem is not None:
                    return lines, f"packages: find_links {link}: {problem}"
                lines.append(f"packages: find_links {link} answers")
                continue
            if not os.path.isdir(link):
                return lines, f"packages: find_links {link} is not a directory"
            wheels = sum(name.endswith(".whl") for name in os.listdir(link))
            lines.append(f"packages: find_links {link} holds {wheels} wheels")
        if self.settings.index is not None:
            problem = _reachable(self.settings.index)
            if problem is not None:
                return lines, f"packages: package_index {self.settings.index}: {problem}"
            lines.append(f"packages: package_index {self.settings.index} answers")
        allowed = ", ".join(str(r) for r in self._ceiling)
        lines.append(f"packages: requests may name {allowed or 'none'} ([pool.limits] packages)")
        return lines, None

    def submit(self, spec: JobSpec, done: Callable[[JobSpec | None, str | None], None]) -> None:
        """Call ``done(spec_with_its_environment, None)`` once ``spec``'s packages are installed, or
        ``done(None, why)``: at once (on this thread) for a set already in place, else from the install's own
        thread. Raises :class:`RequestError` when this pool installs nothing or too many jobs wait."""
        problem = self.problem()
        if problem is not None:
            raise RequestError(f"packages: {problem}")
        key = self._key(spec.packages)

        def placed(env: str | None, why: str | None) -> None:
            done(None, why) if env is None else done(with_environment(spec, env), None)

        with self._lock:
            env = self._memo.get(key)
            if env is None or not os.path.isdir(env):
                if self._waiting >= MAX_WAITING:
                    raise RequestError(f"packages: {MAX_WAITING} jobs already wait for packages to be installed; "
                                       "send this one again after some of their results")
                self._waiting += 1
                install = self._pending.get(key)
                if install is None:
                    install = self._pending[key] = _Install()
                    threading.Thread(target=self._run, args=(key, list(spec.packages), install),
                                     name="pynox-install", daemon=True).start()
                install.waiting.append(placed)
                return
        placed(env, None)

    def place(self, spec: JobSpec) -> JobSpec:
        """``spec`` with its packages' environment, waiting on this thread for the install; raises
        :class:`RequestError` saying why it could not be done (a session's first step, ``pynox run``)."""
        if not spec.packages:
            return spec
        outcome: list[tuple[JobSpec | None, str | None]] = []
        ready = threading.Event()

        def done(placed: JobSpec | None, why: str | None) -> None:
            outcome.append((placed, why))
            ready.set()

        self.submit(spec, done)
        ready.wait()
        placed, why = outcome[0]
        if placed is None:
            raise RequestError(why or "packages: the install failed")
        return placed

    def wait_idle(self) -> None:
        """Until no job waits for an install (the pool's drain: every accepted job is queued first)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._pending and not self._delivering)

    def session_dir(self) -> str:
        """A new, empty directory a session's `%pip install` lines install into: granted read-only to the
        session when it starts (Landlock covers what is added beneath it later), and on its sys.path."""
        parent = os.path.join(self.root, "sessions")
        os.makedirs(parent, mode=0o755, exist_ok=True)
        return tempfile.mkdtemp(dir=parent, prefix="session-")

    def pip(self, directory: str, words: list[str]) -> str:
        """A session's `%pip install NAME...` line: NAME installed into the session's ``directory``, under the
        same ceiling and from the same index as the packages grant. Returns what the job prints; raises with
        the reason (its message is what the model reads)."""
        if not words or words[0] != "install" or len(words) < 2:
            raise RequestError("%pip: only `%pip install NAME...` runs here (names with version specifiers, no "
                               "options)")
        problem = self.problem()
        if problem is not None:
            raise RequestError(f"%pip install: {problem}")
        wanted = requirements(words[1:], "%pip install")
        check_packages(wanted, self._allowed)
        packages = [str(requirement) for requirement in wanted]
        deadline = time.monotonic() + self.settings.timeout
        with self._slots, tempfile.TemporaryDirectory(dir=self.root, prefix=".work-") as work:
            constraints = os.path.join(work, "constraints.txt")
            with open(constraints, "w") as handle:
                handle.write("".join(f"{r}\n" for r in self._ceiling if r.specifier))
            target = os.path.join(work, "target")
            self._uv(["pip", "install", "--target", target, "--link-mode", "copy", "-c", constraints, "--quiet",
                      *packages], deadline, packages)
            size = _size(target) + _size(directory)
            if size > self.settings.max_size:
                raise RequestError(f"%pip install: {', '.join(packages)} would bring this session's packages to "
                                   f"{size / (1 << 20):.1f} MiB, more than this pool's max_install_size of "
                                   f"{format_size(self.settings.max_size)}")
            _read_only(target)
            added = []
            for name in sorted(os.listdir(target)):
                if name.startswith("."):
                    continue
                if not os.path.exists(os.path.join(directory, name)):  # already there: kept as it was
                    os.rename(os.path.join(target, name), os.path.join(directory, name))
                if name.endswith(".dist-info"):
                    added.append(name.removesuffix(".dist-info").replace("-", " ", 1))
            with self._lock:
                self.installs += 1
        return f"Installed for this session: {', '.join(added)}"

    # -- one install -----------------------------------------------------------------------------------
    def _key(self, packages: Sequence[str]) -> str:
        facts = {"packages": sorted(packages), "ceiling": [str(r) for r in self._ceiling], "python": self.python,
                 "index": self.settings.index, "find_links": list(self.settings.find_links),
                 "sdist": self.settings.sdist}
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()

    def _run(self, key: str, packages: list[str], install: _Install) -> None:
        env: str | None = None
        why: str | None = None
        try:
            with self._slots:
                env = self._install(packages)
        except RequestError as exc:
            why = str(exc)
        except Exception as exc:  # the install's failure costs the jobs that wait for it, never the pool
            _log.exception("installing %s failed", packages)
            why = f"packages: the pool failed while installing them ({type(exc).__name__}); nothing ran"
        with self._lock:
            if env is not None:
                self._memo[key] = env
            del self._pending[key]
            waiting, install.waiting = install.waiting, []
            self._waiting -= len(waiting)
            self._delivering += 1
        try:
            for placed in waiting:
                placed(env, why)
        finally:
            with self._lock:
                self._delivering -= 1
                self._lock.notify_all()

    def _install(self, packages: list[str]) -> str:
        """Resolve ``packages`` to pinned versions, then install exactly those into the environment named by
        their hash, unless it is there already. Returns its path."""
        deadline = time.monotonic() + self.settings.timeout
        os.makedirs(self.envs, mode=0o755, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=".work-") as work:
            wanted = os.path.join(work, "requirements.in")
            constraints = os.path.join(work, "constraints.txt")
            pinned = os.path.join(work, "requirements.txt")
            with open(wanted, "w") as handle:
                handle.write("".join(f"{requirement}\n" for requirement in packages))
            with open(constraints, "w") as handle:
                handle.write("".join(f"{r}\n" for r in self._ceiling if r.specifier))
            self._uv(["pip", "compile", wanted, "-c", constraints, "-o", pinned, "--no-header", "--no-annotate",
                      "--quiet"], deadline, packages)
            with open(pinned) as handle:
                lock = "".join(line for line in handle if line.strip() and not line.lstrip().startswith("#"))
            env = os.path.join(self.envs, hashlib.sha256(f"{self.python}\n{lock}".encode()).hexdigest()[:32])
            if os.path.isdir(env):
                return env
            target = tempfile.mkdtemp(dir=self.envs, prefix=".building-")
            try:
                self._uv(["pip", "install", "--target", target, "--no-deps", "--link-mode", "copy", "-r", pinned,
                          "--quiet"], deadline, packages)
                size = _size(target)
                if size > self.settings.max_size:
                    raise RequestError(f"packages: {', '.join(packages)} would take {size / (1 << 20):.1f} MiB, "
                                       f"more than this pool's max_install_size of "
                                       f"{format_size(self.settings.max_size)}; "
                                       "ask for fewer or smaller packages")
                _read_only(target)
                try:
                    os.rename(target, env)
                except OSError:  # another pool sharing this directory put the same set in place first
                    if not os.path.isdir(env):
                        raise
                else:
                    os.chmod(env, 0o555)
                    with self._lock:
                        self.installs += 1
                    _log.info("installed %s into %s", packages, env)
                return env
            finally:
                if os.path.isdir(target):
                    _remove(target)

    def _uv(self, args: list[str], deadline: float, packages: list[str]) -> None:
        assert self.uv is not None  # problem() said so before any install started
        command = [self.uv, *args, "--no-config", "--python", self.python, *self.source_args()]
        left = deadline - time.monotonic()
        if left <= 0:
            raise RequestError(self._too_slow(packages))
        # uv's own variables are left out: one (UV_EXTRA_INDEX_URL, say) could add an index the config does not
        # name. The rest of the pool's environment stays (a proxy the index needs).
        environment = {**{key: value for key, value in os.environ.items() if not key.startswith("UV_")},
                       "UV_CACHE_DIR": os.path.join(self.root, "cache"), "NO_COLOR": "1"}
        # A session of its own: a timeout kills uv and whatever it started.
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=environment, start_new_session=True, text=True)
        try:
            _, stderr = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise RequestError(self._too_slow(packages)) from None
        if process.returncode != 0:
            raise RequestError(_explain(stderr, packages))

    def source_args(self) -> list[str]:
        """Where uv looks: the operator's index or none, the wheelhouses, and wheels only unless allowed."""
        args = ["--index-url", self.settings.index] if self.settings.index else ["--no-index"]
        for link in self.settings.find_links:
            args += ["--find-links", link]
        return args if self.settings.sdist else [*args, "--only-binary", ":all:"]

    def _too_slow(self, packages: list[str]) -> str:
        return (f"packages: installing {', '.join(packages)} took longer than this pool's install_timeout of "
                f"{format_duration(self.settings.timeout)}; nothing ran. Ask for fewer packages, or send the "
                "request again (a set partly fetched may be faster the next time)")


def with_environment(spec: JobSpec, env: str) -> JobSpec:
    """``spec`` with the environment its packages are installed in: readable, and on its ``sys.path``."""
    confinement = msgspec.structs.replace(spec.confinement, package_dirs=[*spec.confinement.package_dirs, env],
                                          allow_read=[*spec.confinement.allow_read, env])
    return msgspec.structs.replace(spec, confinement=confinement)


_NOT_FOUND = re.compile(r"Because (\S+) was not found|No matching distribution found for (\S+)|"
                        r"there is no version of (\S+)")
_CONFLICT = re.compile(r"you require (\S+) and (\S+?),? we can conclude")
_NO_WHEEL = re.compile(r"Because (\S+?)(?:==\S+)? has no usable wheels|Wheels are required for `([^`]+)`")


def _explain(stderr: str, packages: list[str]) -> str:
    """uv's failure, as what the model can do about it."""
    no_wheel = _NO_WHEEL.search(stderr)
    if no_wheel is not None:
        name = next(group for group in no_wheel.groups() if group)
        return (f"packages: {name} has no wheel for this Python, only a source distribution, and this pool "
                "installs wheels only (building one would run its code on the host). Ask for a version that has "
                "a wheel, or another package")
    missing = _NOT_FOUND.search(stderr)
    if missing is not None:
        name = next(group for group in missing.groups() if group)
        return (f"packages: {name} was not found in this pool's package index (or no version of it matches); "
                "check the name (a distribution's name may differ from its module's) and the version")
    conflict = _CONFLICT.search(stderr)
    if conflict is not None:
        return (f"packages: {conflict.group(1)} conflicts with {conflict.group(2)}: the [pool.limits] ceiling allows "
                "only some versions, or another package needs others; ask for versions within them")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()][:6]
    return f"packages: {', '.join(packages)} could not be installed: {' '.join(lines)[:800] or 'uv failed'}"


def _reachable(location: str) -> str | None:
    """Why ``location`` (a URL or a directory) cannot be read, or None."""
    if "://" not in location:
        return None if os.path.isdir(location) else "is not a directory"
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(location, timeout=5) as answer:
            answer.read(1)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return f"does not answer ({exc})"
    return None


def _size(root: str) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total


def _read_only(root: str) -> None:
    """No write bit anywhere: Landlock already grants jobs only reading; this holds for every other process
    of an unprivileged pool too."""
    for directory, dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & 0o555)
        for name in dirs:
            os.chmod(os.path.join(directory, name), 0o555)


def _remove(root: str) -> None:
    for directory, dirs, _ in os.walk(root):
        for name in dirs:
            try:
                os.chmod(os.path.join(directory, name), 0o755)
            except OSError:
                pass
    shutil.rmtree(root, ignore_errors=True)


