"""How much of CPython's own test suite passes inside a Pynox job, beside the same run unconfined.

Each module of CPython's regression suite (``test.<name>``, the interpreter's own
``test`` package) runs twice with the same small runner: in a plain interpreter,
and as a Pynox job whose only write grant is a scratch directory used as cwd,
HOME and TMPDIR. For every test that passes unconfined and not confined, the
confined failure is classified by its cause, from its traceback:

* ``subprocess``: a program or process was denied (by contract);
* ``socket``: a socket or address was denied (no network grant, by contract);
* ``no /dev/shm``: POSIX shared memory (multiprocessing's locks) is not granted, by contract;
* ``outside the grants``: Landlock refused a path (EACCES), by contract;
* ``other denied call``: the seccomp filter refused something else (EPERM, ENOSYS);
* ``limit``: memory, threads, descriptors, file size, or the module's time ran out;
* ``unexplained``: none of these, which is a Pynox bug until shown otherwise.

    python bench/stdlib_compat.py [--modules test_shutil test_csv ...] [--json out.json] [--markdown out.md]
                                  [--contract docs/sandbox-contract.md]

It prints one line per module and the total share of unconfined-passing tests that pass confined.
``--contract`` rewrites the table docs/sandbox-contract.md carries in "What differs from plain CPython".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import pynox

# Pure-Python and C-backed modules of every kind a model's code touches: text, numbers, data formats,
# files and archives, dates, the typing and data-model machinery, concurrency within one process.
MODULES = (
    "test_abc", "test_argparse", "test_array", "test_ast", "test_base64", "test_binascii", "test_bisect",
    "test_bool", "test_bytes", "test_bz2", "test_calendar", "test_cmath", "test_codecs", "test_collections",
    "test_complex", "test_configparser", "test_contextlib", "test_copy", "test_csv", "test_dataclasses",
    "test_datetime", "test_decimal", "test_defaultdict", "test_deque", "test_dict", "test_difflib",
    "test_enum", "test_exceptions", "test_filecmp", "test_fileinput", "test_fileio", "test_float",
    "test_fnmatch", "test_fractions", "test_functools", "test_generators", "test_genericalias", "test_getopt",
    "test_gettext", "test_glob", "test_gzip", "test_hashlib", "test_heapq", "test_hmac", "test_html",
    "test_htmlparser", "test_inspect", "test_int", "test_ipaddress", "test_itertools", "test_json",
    "test_keywordonlyarg", "test_list", "test_locale", "test_logging", "test_long", "test_lzma", "test_math",
    "test_memoryio", "test_memoryview", "test_mmap", "test_netrc", "test_operator", "test_ordered_dict",
    "test_pathlib", "test_pickle", "test_plistlib", "test_posixpath", "test_pprint", "test_queue",
    "test_random", "test_re", "test_reprlib", "test_sched", "test_secrets", "test_set", "test_shelve",
    "test_shutil", "test_slice", "test_sort", "test_statistics", "test_string", "test_string_literals",
    "test_struct", "test_tarfile", "test_tempfile", "test_textwrap", "test_threading_local", "test_time",
    "test_tomllib", "test_traceback", "test_tuple", "test_typing", "test_unicodedata", "test_urlparse",
    "test_uuid", "test_weakref", "test_with", "test_xml_etree", "test_zipfile", "test_zlib", "test_zoneinfo",
)
_MODULE_TIMEOUT = 600
_TEST_TIMEOUT = 30
_MARK = "@@pynox-stdlib-compat@@"

# The runner, the same both ways: each test's outcome and, for a failure, the end of its traceback.
# A test gets PER_TEST seconds (SIGALRM raises in it: a wait for a thread that died returns), and what
# its threads raised is kept with its failure (a denied socket in a server thread says why it waited).
RUNNER = """\
import json, os, signal, sys, threading, traceback, unittest, warnings
warnings.simplefilter("ignore")
module, work = sys.argv[1], sys.argv[2]
os.chdir(work)
outcomes = {}
died = []
threading.excepthook = lambda args: died.append("".join(traceback.format_exception(
    args.exc_type, args.exc_value, args.exc_traceback))[-800:])
class TestTimeLimit(Exception):
    pass
def expired(signum, frame):
    raise TestTimeLimit("timed out (one test)")
signal.signal(signal.SIGALRM, expired)
# Library code that swallows a refused chmod or chown (tarfile, as root, gives up a member's mode and
# times when giving it its owner fails) leaves no errno in the failure: note each refusal with the test.
def noted(call):
    def wrapper(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except PermissionError as exc:
            died.append(f"os.{call.__name__} refused: {exc}\\n")
            raise
    return wrapper
os.chmod, os.chown = noted(os.chmod), noted(os.chown)
class Collect(unittest.TestResult):
    def startTest(self, test):
        died.clear()
        signal.alarm(PER_TEST)
        super().startTest(test)
    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)
    def addSuccess(self, test): outcomes[test.id()] = ["pass", ""]
    def addSkip(self, test, reason): outcomes[test.id()] = ["skip", str(reason)[:200]]
    def addExpectedFailure(self, test, err): outcomes[test.id()] = ["pass", ""]
    def addUnexpectedSuccess(self, test): outcomes[test.id()] = ["fail", "unexpected success"]
    def _failed(self, test, err):
        text = "".join(died) + self._exc_info_to_string(err, test)
        name = getattr(test, "id", lambda: str(test))()
        earlier = outcomes.get(name, ["", ""])[1] if outcomes.get(name, [""])[0] == "fail" else ""
        outcomes[name] = ["fail", (earlier[-2000:] + text[-2000:]) if earlier else text[-2500:]]
    addFailure = addError = _failed
    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._failed(test, err)
try:
    suite = unittest.defaultTestLoader.loadTestsFromName("test." + module)
    suite.run(Collect())
except BaseException as exc:
    import traceback
    outcomes["<module>"] = ["fail", "".join(traceback.format_exception(exc))[-1500:]]
sys.stdout.flush()
os.write(1, ("\\n" + MARK + json.dumps(outcomes) + "\\n").encode())
os._exit(0)
""".replace("MARK", repr(_MARK)).replace("PER_TEST", str(_TEST_TIMEOUT))

_CAUSES = (
    # multiprocessing's locks need POSIX shared memory, /dev/shm, which is not granted.
    ("no /dev/shm", re.compile(r"SemLock|/dev/shm")),
    ("subprocess", re.compile(r"subprocess|_posixsubprocess|fork_exec|os\.fork|\bfork\(|spawn|os\.system|"
                              r"popen|execv|multiprocessing|script_helper|assert_python_(ok|failure)|"
                              r"requires (ifconfig|ip)\b")),
    ("socket", re.compile(r"socket|ssl\.py|selector_events|create_server|create_connection|getaddrinfo|"
                          r"SocketHandler|DatagramHandler|SysLogHandler|HTTPHandler|SMTPHandler|smtplib|IPv6")),
    ("outside the grants", re.compile(r"\[Errno 13\]|Permission denied|requires write access")),
    ("limit", re.compile(r"MemoryError|can't start new thread|Too many open files|File too large|"
                         r"Cannot allocate memory|"
                         r"\[Errno 24\]|\[Errno 27\]|timed out \(the module\)|timed out \(one test\)")),
    ("other denied call", re.compile(r"\[Errno 1\]|Operation not permitted|\[Errno 38\]|Function not implemented|"
                                     r"extended attribute")),
)


def classify(traceback_text: str) -> str:
    for cause, pattern in _CAUSES:
        if pattern.search(traceback_text):
            return cause
    return "unexplained"


def _parse(stdout: str) -> dict[str, list[str]] | None:
    index = stdout.rfind(_MARK)
    if index < 0:
        return None
    try:
        return json.loads(stdout[index + len(_MARK):].splitlines()[0])
    except (ValueError, IndexError):
        return None


def run_unconfined(module: str, work: str) -> dict[str, list[str]]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work}
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER, module, work], capture_output=True, text=True,
                              env=env, cwd=work, timeout=_MODULE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"<module>": ["fail", "timed out (the module)"]}
    return _parse(done.stdout) or {"<module>": ["fail", done.stderr[-1500:]]}


def run_confined(pool: pynox.Pool, module: str, work: str) -> dict[str, list[str]]:
    result = pool.run(RUNNER, args=[module, work], allow_write=[work], timeout=_MODULE_TIMEOUT, memory="2g",
                      max_output="8m")
    parsed = _parse(result.stdout)
    if parsed is not None:
        return parsed
    why = "timed out (the module)" if result.exit == 124 else f"exit {result.exit}: {result.error}"
    return {"<module>": ["fail", f"{why}\n{result.stderr[-1200:]}"]}


def compare(module: str, pool: pynox.Pool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pynox-compat-") as plain_dir, \
            tempfile.TemporaryDirectory(prefix="pynox-compat-") as job_dir:
        plain = run_unconfined(module, plain_dir)
        confined = run_confined(pool, module, job_dir)
    passing = [test for test, (outcome, _) in plain.items() if outcome == "pass"]
    causes: Counter[str] = Counter()
    examples: dict[str, str] = {}
    kept = 0
    for test in passing:
        outcome, text = confined.get(test, confined.get("<module>", ["fail", "missing"]))
        if outcome == "pass":
            kept += 1
            continue
        # The test's own name is evidence too: a skip reason or a setUp's failure may not say "socket",
        # but SysLogHandlerTest failing for want of its socket does.
        cause = classify(f"{test}\n{text}")
        causes[cause] += 1
        examples.setdefault(cause, f"{test}: {(text.strip().splitlines() or [''])[-1][:200]}")
    return {"module": module, "passing_unconfined": len(passing), "passing_confined": kept,
            "causes": dict(causes), "examples": examples}


def markdown(rows: list[dict[str, Any]]) -> str:
    total = sum(r["passing_unconfined"] for r in rows)
    kept = sum(r["passing_confined"] for r in rows)
    causes: Counter[str] = Counter()
    for row in rows:
        causes.update(row["causes"])
    lines = [f"Over {len(rows)} modules of CPython {sys.version.split()[0]}'s own test suite, "
             f"**{kept:,} of the {total:,} tests that pass unconfined also pass in a Pynox job "
             f"({100 * kept / max(total, 1):.1f} %)**, with one write grant as cwd, HOME and TMPDIR and "
             "no network. The rest, by cause:", "",
             "| cause | tests |", "| --- | --- |"]
    lines += [f"| {cause} | {count:,} |" for cause, count in causes.most_common()]
    lines += ["", "| module | pass unconfined | pass in Pynox | lost to |", "| --- | --- | --- | --- |"]
    for row in rows:
        if row["causes"]:
            lost = ", ".join(f"{cause} {count}" for cause, count in sorted(row["causes"].items()))
            lines.append(f"| {row['module']} | {row['passing_unconfined']} | {row['passing_confined']} | {lost} |")
    lines += ["", f"Every other module ({sum(1 for r in rows if not r['causes'])}) passes in Pynox exactly "
              "what it passes unconfined."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="*", default=list(MODULES))
    parser.add_argument("--json", help="write every module's figures and example failures here")
    parser.add_argument("--markdown", help="write the contract's table here")
    parser.add_argument("--contract", help="replace the table between the stdlib_compat markers of this file")
    options = parser.parse_args()
    missing = [module for module in options.modules if importlib.util.find_spec(f"test.{module}") is None]
    if missing:
        raise SystemExit(f"{sys.executable} lacks CPython's test modules {', '.join(missing[:5])}: use an "
                         "interpreter that has its test suite (pyenv's builds do; on Debian, install "
                         "libpython3.11-testsuite)")
    rows = []
    started = time.monotonic()
    with pynox.Pool(workers=2) as pool:
        for module in options.modules:
            row = compare(module, pool)
            rows.append(row)
            causes = ", ".join(f"{k} {v}" for k, v in sorted(row["causes"].items())) or "-"
            print(f"{module:28} {row['passing_confined']:5}/{row['passing_unconfined']:<5} {causes}", flush=True)
    total = sum(r["passing_unconfined"] for r in rows)
    kept = sum(r["passing_confined"] for r in rows)
    print(f"total: {kept}/{total} = {100 * kept / max(total, 1):.2f} % in {time.monotonic() - started:.0f} s")
    if options.json:
        with open(options.json, "w") as out:
            json.dump(rows, out, indent=1)
    if options.markdown:
        with open(options.markdown, "w") as out:
            out.write(markdown(rows))
    if options.contract:
        replace_block(options.contract, markdown(rows))


def replace_block(path: str, table: str) -> None:
    with open(path) as doc:
        text = doc.read()
    begin, end = "<!-- stdlib_compat: begin -->\n", "<!-- stdlib_compat: end -->"
    head, found, rest = text.partition(begin)
    _, closed, tail = rest.partition(end)
    if not found or not closed:
        raise SystemExit(f"{path} has no stdlib_compat markers")
    with open(path, "w") as doc:
        doc.write(head + begin + table + end + tail)


if __name__ == "__main__":
    main()
