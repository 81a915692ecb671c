"""``PynoxExecutor``: the ``PythonExecutor`` behind ``CodeAgent(executor=PynoxExecutor(...))``.

Each agent step's code runs in one Pynox session (a confined CPython process
whose globals survive between steps). The agent's tools and managed agents stay
in the host process: each is a Pynox host function, bound in the session's
globals under its plain name, so the model's code calls ``web_search(...)`` as
it would in smolagents' own executor while the tool itself keeps the host's
network and credentials, which the code never gets.

How a step ends:

- ``final_answer(x)`` in the sandbox calls the host's ``final_answer`` tool (its
  validation runs there), which records the value, then raises an exception
  that stops the step; the executor returns ``is_final_answer=True``.
- A trailing expression's value comes back as the step's output (what
  smolagents shows as "Last output from code snippet"), through one more host
  function; the code is not rewritten beyond wrapping that expression, so error
  line numbers stay the model's own.
- An exception in the code raises :class:`smolagents.local_python_executor.InterpreterError`
  with the type, message, line and hint; the step's prints stay in
  ``state["_print_outputs"]`` so the agent shows them, then retries.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from smolagents.local_python_executor import DEFAULT_MAX_LEN_OUTPUT, CodeOutput, InterpreterError, PythonExecutor
from smolagents.utils import truncate_content

import pynox
from pynox import check_grants

from . import _values
from ._gate import CallGate
from ._settings import saved_grants
from ._values import NotSerializable, from_json_safe, images_from_png, to_json_safe

__all__ = ["PynoxExecutor"]

logger = logging.getLogger(__name__)

# The host function that carries a step's trailing expression value; a tool may not take this name.
STEP_VALUE = "pynox_step_value"
_EMIT = "__pynox_emit__"  # its wrapper in the session's globals
_MAX_VARIABLES = 900_000  # bytes of JSON: a request line is capped at 1 MiB
_MAX_VALUE = 900_000  # bytes of JSON for a step's trailing value: a host call's arguments are capped at 1 MB
_CODEC = inspect.getsource(_values)  # runs in each session's process
_UNSET = object()  # timeout_seconds not given (None means "no limit" to smolagents)
CROSSING_TYPES = ("JSON values, tuples, sets, bytes, dates, Decimal, paths, numpy arrays, pandas DataFrames and "
                  "Series, PIL images and dataclasses")

# Runs once per session process (and again after sending new variables), as its own step. Values cross with
# the codec of ._values, whose source runs here in a namespace of its own.
_SETUP = """\
def __pynox_setup__(names, variables, codec):
    import json
    import pynox_host

    values = {{"__name__": "pynox_smolagents_values"}}
    exec(codec, values)
    to_json, from_json = values["to_json_safe"], values["from_json_safe"]

    class FinalAnswerException(BaseException):
        \"\"\"Ends the step: the host already holds the answer. BaseException, so `except Exception` lets it pass.\"\"\"

    def bind(name, host):
        def call(*args, **kwargs):
            try:
                sent = to_json(list(args)), to_json(kwargs)
            except TypeError as error:
                raise TypeError(f"{{name}}(): {{error}}; tools take str, numbers, lists, dicts, tuples, sets, "
                                "bytes, dates, numpy arrays, pandas DataFrames and Series, PIL images and "
                                "dataclasses") from None
            answer = from_json(host(*sent))
            if name == "final_answer":
                raise FinalAnswerException()
            return answer
        call.__name__ = name
        return call

    send_value = getattr(pynox_host, {step_value!r})

    def emit(value):
        if value is not None:
            try:
                sent = to_json(value)
                too_big = len(json.dumps(sent)) > {max_value}
            except (TypeError, ValueError):
                sent, too_big = None, True
            if too_big:  # only its display can come back: shown truncated anyway
                sent = str(value)[:{max_value}]
            try:
                send_value(sent)
            except pynox_host.HostError:
                pass  # only the display of the value is lost; the step itself succeeded
        return value

    bound = {{name: bind(name, getattr(pynox_host, name)) for name in names}}
    bound[{emit!r}] = emit
    return {{**from_json(json.loads(variables)), **bound}}

globals().update(__pynox_setup__({names!r}, {variables!r}, {codec!r}))
del __pynox_setup__
"""


class PynoxExecutor(PythonExecutor):
    """Run a ``CodeAgent``'s code in one Pynox session: ``CodeAgent(tools, model, executor=PynoxExecutor(...))``,
    or :class:`pynox_smolagents.PynoxCodeAgent`, which also tells the model what the sandbox allows and saves
    and loads with it.

    ``pool``: the Pynox pool (default: the process-wide pool, started on the first step). Permissions come from
    ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env, timeout, memory,
    max_output, ...) and apply to every step; the timeout is per step and includes the time the agent's tools take.
    ``functions`` are extra host functions bound by name like the tools (the agent's prompt does not list them: say
    so in its ``instructions``). ``name`` is the file name errors point at (``agent.py``).
    ``max_print_outputs_length`` caps what a step's prints show the model, as for smolagents' local executor
    (default 50,000 characters).

    Values cross as in smolagents' remote executors: tool arguments and results, ``final_answer``, a step's
    trailing value and the agent's variables (``additional_args``) may be JSON values, tuples, sets, bytes,
    dates, ``Decimal``, paths, numpy arrays, pandas DataFrames and Series, PIL images and dataclasses (which
    arrive as dicts naming their class). Figures a step draws and PNG images it displays are kept in
    :attr:`step_images`.

    A timeout or crash ends the session: the next step starts a fresh process with the tools and the agent's
    variables bound again, and the error the model reads says that its own variables are gone.

    smolagents' own executor arguments mean what they mean for its other executors: ``timeout_seconds`` is
    the time limit of a step (Pynox's ``timeout``; give one or the other; ``None``, no limit, is refused:
    every Pynox job has one); ``additional_authorized_imports`` are checked to be installed, as smolagents'
    local executor checks them, and the code may import them (and any other installed package: what the code
    may import and touch is the kernel policy's decision here, not an import list).
    """

    def __init__(self, pool: pynox.Pool | None = None, *, profile: str | None = None,
                 functions: Mapping[str, Callable[..., Any]] | None = None, name: str = "agent.py",
                 max_print_outputs_length: int | None = None, timeout_seconds: float | object | None = _UNSET,
                 additional_authorized_imports: Sequence[str] = (), **grants: Unpack[pynox.Grants]) -> None:
        # Check the grants now (a bad one raises here, not as an error the model would retry forever).
        check_grants("PynoxExecutor()", grants)
        if timeout_seconds is not _UNSET:
            grants["timeout"] = _step_timeout(timeout_seconds, grants.get("timeout"))
        self.additional_authorized_imports = _installed(additional_authorized_imports)
        if functions and STEP_VALUE in functions:
            raise ValueError(f"{STEP_VALUE!r} is PynoxExecutor's own host function: give yours another name")
        if max_print_outputs_length is not None and (type(max_print_outputs_length) is not int
                                                     or max_print_outputs_length < 1):
            raise ValueError(f"max_print_outputs_length must be a positive int, not {max_print_outputs_length!r}")
        self._grants_checked = pynox.CodeTool(pool, profile=profile, functions=functions, **grants)
        self.pool = pool
        self.grants: dict[str, Any] = {**grants, **({"profile": profile} if profile else {})}
        self.name = name
        self.max_print_outputs_length = max_print_outputs_length
        self.state: dict[str, Any] = {"_print_outputs": ""}  # CodeAgent reads the logs of a failed step here
        self.step_images: list[Any] = []  # the last step's figures, as PIL images
        self._functions = dict(functions or {})
        self._tools: dict[str, Callable[..., Any]] = {}
        self._variables: dict[str, Any] = {}  # as they will cross: JSON values with type markers
        self._variables_pending = False
        self._session: pynox.SessionRunner | None = None
        self._session_names: frozenset[str] = frozenset()
        self._step_lock = threading.Lock()
        # The step's host calls run on threads of their own (up to 8 at once): what they may still do is
        # the gate's to decide (see _gate.py), which also lets the step wait for the calls in flight.
        self._gate = CallGate()
        self._final: list[Any] = []  # the step's final answer, once recorded
        self._value: list[Any] = []  # the step's trailing expression value, once sent

    def follow_agent(self, max_print_outputs_length: int | None) -> None:
        """Take the agent's ``max_print_outputs_length`` (what smolagents passes to the executors it builds);
        ``ValueError`` if this executor was given another."""
        if max_print_outputs_length is None:
            return
        if self.max_print_outputs_length is None:
            self.max_print_outputs_length = max_print_outputs_length
        elif self.max_print_outputs_length != max_print_outputs_length:
            raise ValueError(f"the agent's max_print_outputs_length={max_print_outputs_length} and its "
                             f"PynoxExecutor's {self.max_print_outputs_length} differ: give it once")

    @property
    def permissions(self) -> pynox.ToolDescription:
        """What the model is told the code may do, from the grants after profile and ceiling."""
        return self._grants_checked.description

    def to_dict(self) -> dict[str, Any]:
        """The executor's settings as JSON, what a saved agent is loaded with (see :class:`PynoxCodeAgent`).

        The pool is not saved (the loaded agent runs on the pool it is given, else Pynox's default pool).
        Host functions cannot be (they are code), nor ``env`` (its values may be credentials): an executor
        with either raises ``ValueError``.
        """
        if self._functions:
            raise ValueError(f"PynoxExecutor(functions=...) cannot be saved: {', '.join(sorted(self._functions))} "
                             "are code; make them smolagents tools, which the agent saves with itself")
        saved = saved_grants(self.grants, "PynoxExecutor")
        if self.name != "agent.py":
            saved["name"] = self.name
        if self.max_print_outputs_length is not None:
            saved["max_print_outputs_length"] = self.max_print_outputs_length
        return saved

    # -- PythonExecutor ------------------------------------------------------------------------------------
    def send_tools(self, tools: Mapping[str, Any]) -> None:
        """Called by the agent at each run with its tools and managed agents; each becomes a host function."""
        for tool_name in tools:
            if not tool_name.isidentifier() or tool_name.startswith("_") or tool_name == STEP_VALUE:
                raise ValueError(f"tool name {tool_name!r} cannot be a Pynox host function: use a public Python "
                                 f"identifier other than {STEP_VALUE!r}")
        self._tools = dict(tools)
        if self._session is not None and self._host_names() != self._session_names:
            # The pool fixes a session's host functions when it starts: a new set needs a new process.
            logger.info("the agent's tools changed: starting a new Pynox session")
            self._end_session()

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Called by the agent at each run with its state (``additional_args``): bound as globals before the next
        step. A value of a type that cannot cross raises ``TypeError`` here."""
        if not variables:
            return
        crossing, bad = {}, []
        for key, value in variables.items():
            try:
                crossing[key] = to_json_safe(value)
            except NotSerializable:
                bad.append(f"{key!r} ({type(value).__name__})")
            except (ValueError, OSError) as exc:  # an image PIL could not write, an array numpy could not list
                bad.append(f"{key!r} ({type(value).__name__}: {exc})")
        if bad:
            raise TypeError(f"PynoxExecutor cannot send these variables into the sandbox: {', '.join(bad)}. It "
                            f"sends {CROSSING_TYPES}; write other data to a file the sandbox may read.")
        self._variables.update(crossing)
        self._variables_pending = True

    def __call__(self, code_action: str) -> CodeOutput:
        with self._step_lock:
            self.state["_print_outputs"] = ""
            self.step_images = []
            session = self._ready_session()
            del self._final[:], self._value[:]
            self._gate.begin_step()
            wrapped = _wrap_trailing_expression(code_action)
            try:
                result = session.run(wrapped, name=self.name)
            finally:
                self._end_step_calls()
            result = _as_the_model_wrote(result, wrapped, code_action, self.name)
            logs = _logs(result, self.max_print_outputs_length or DEFAULT_MAX_LEN_OUTPUT)
            self.state["_print_outputs"] = logs
            self.step_images = _images(result)
            final, value = list(self._final), list(self._value)
            del self._final[:], self._value[:]  # released: the next step starts with neither
            if final:
                return CodeOutput(output=final[0], logs=logs, is_final_answer=True)
            if not result.ok:
                raise InterpreterError("Code execution failed: " + result.error_text)
            return CodeOutput(output=value[0] if value else None, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """End the session's process (``CodeAgent.cleanup()`` and ``with CodeAgent(...)`` call this)."""
        with self._step_lock:
            self._end_session()

    # -- the session ---------------------------------------------------------------------------------------
    def _host_names(self) -> frozenset[str]:
        return frozenset([*self._tools, *self._functions, STEP_VALUE])

    def _host_functions(self) -> dict[str, Callable[..., Any]]:
        # Late-bound: a tool replaced between runs under the same name is the one called.
        functions = {name: self._bind_tool(name) for name in [*self._functions, *self._tools]}
        functions[STEP_VALUE] = self._record_value
        return functions

    def _record_value(self, sent: Any) -> None:
        # Only the step's last value is kept: a step calling this in a loop holds one value, not all.
        value = _read(STEP_VALUE, sent)
        with self._gate.admitted(STEP_VALUE):
            self._value[:] = [value]

    def _bind_tool(self, name: str) -> Callable[..., Any]:
        def call(args: Any = (), kwargs: Any = None) -> Any:
            answers = name == "final_answer" and name in self._tools  # the agent's own final_answer tool
            self._gate.check(name)  # before anything is read; again as it enters, where it counts
            args, kwargs = _read(name, args), _read(name, kwargs or {})
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise pynox.HostError(f"{name}(): call it as a function, {name}(...)")
            self._gate.enter(name, answers=answers)  # the first final_answer shuts every later call out
            refused = False
            try:
                value = (self._tools.get(name) or self._functions[name])(*args, **kwargs)
                if answers:
                    self._final[:] = [value]
                    return None  # the sandbox stops the step; the value needs no trip back
                return _written(name, value)
            except BaseException:
                refused = answers  # its checks refused the answer: the step goes on, and may answer again
                raise
            finally:
                self._gate.leave(refused_answer=refused)

        call.__name__ = name
        return call

    def _end_step_calls(self) -> None:
        """The step's process is gone: refuse its threads' further calls, and wait for those in flight, so
        that nothing the step started still acts once it returns (as in smolagents' own executor, where a
        tool call ends before the step does). A tool still running after the step's own time limit is left
        to finish on its own, its result unused."""
        timeout = self._grants_checked.grants.timeout
        if not self._gate.end_step(timeout):
            logger.warning("%d tool calls of the step were still running %s s after it ended; their results "
                           "are not used", self._gate.in_flight, timeout)

    def _ready_session(self) -> pynox.SessionRunner:
        if self._session is None:
            pool = self.pool if self.pool is not None else self._grants_checked.pool
            # smolagents' own executor shows the model a tool's exception text: so does this one, by
            # choice (pynox's default sends only the exception's type; see pynox.client.host_functions).
            self._session = pool.session(functions=self._host_functions(), host_errors="full", **self.grants)
            self._session_names = self._host_names()
        if not self._session.alive or self._variables_pending:
            self._setup(self._session)
        return self._session

    def _setup(self, session: pynox.SessionRunner) -> None:
        """Bind the tools and the variables in the session's globals (a new process has neither)."""
        variables = json.dumps(self._variables)
        if len(variables) > _MAX_VARIABLES:
            raise InterpreterError(f"the agent's variables are {len(variables)} bytes as JSON, over the "
                                   f"{_MAX_VARIABLES}-byte limit: write large data to a file the sandbox may read")
        names = sorted([*self._functions, *self._tools])
        code = _SETUP.format(names=names, variables=variables, codec=_CODEC, step_value=STEP_VALUE, emit=_EMIT,
                             max_value=_MAX_VALUE)
        result = session.run(code, name="pynox_smolagents_setup.py")
        if not result.ok:  # our own code failed: say so plainly, it is not the model's to fix
            raise InterpreterError(f"PynoxExecutor could not prepare the session: {result.text}")
        self._variables_pending = False

    def _end_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()
        # A new process needs the variables again.
        self._variables_pending = bool(self._variables)


def _step_timeout(seconds: object, timeout: object) -> float:
    """smolagents' ``timeout_seconds`` as Pynox's timeout of a step; ``ValueError`` for what Pynox cannot mean."""
    if timeout is not None:
        raise ValueError("PynoxExecutor takes timeout_seconds (smolagents' name) or timeout (Pynox's), not both")
    if seconds is None:
        raise ValueError("PynoxExecutor(timeout_seconds=None) would run a step without a time limit, and every "
                         "Pynox job has one: give a number of seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(f"timeout_seconds must be a positive number of seconds, not {seconds!r}")
    return float(seconds)


def _installed(imports: Sequence[str]) -> list[str]:
    """``imports`` (smolagents' ``additional_authorized_imports``), each checked to be installed, as smolagents'
    local executor checks them (``"*"`` and ``"pkg.*"`` as it reads them)."""
    if isinstance(imports, str):
        raise TypeError("additional_authorized_imports must be a list of module names, not a single string")
    missing = [module for module in (item.split(".")[0] for item in imports)
               if module != "*" and importlib.util.find_spec(module) is None]
    if missing:
        raise InterpreterError(f"Non-installed authorized modules: {', '.join(missing)}. Please install these "
                               "modules or remove them from the authorized imports list.")
    return list(imports)


def _read(name: str, sent: Any) -> Any:
    """A value the sandbox sent to ``name``, rebuilt; whatever the sandbox sends, a clear ``HostError`` at worst."""
    try:
        return from_json_safe(sent)
    except Exception as exc:  # the sandbox wrote it: any failure to rebuild it is the sender's, told as such
        raise pynox.HostError(f"{name}(): a value the code sent could not be read ({type(exc).__name__}: {exc})"
                              ) from None


def _written(name: str, value: Any) -> Any:
    """A tool's result as it crosses into the sandbox."""
    try:
        return to_json_safe(value)
    except (NotSerializable, ValueError, OSError) as exc:
        raise pynox.HostError(f"{name}() returned a {type(value).__name__}, which cannot cross into the sandbox "
                              f"({exc}); it sends {CROSSING_TYPES}") from None


def _images(result: pynox.Result) -> list[Any]:
    """The step's figures and the PNG images it displayed, in order, as PIL images; images a hostile step
    forged to be huge in memory are dropped."""
    pngs = [data for data, mime in result.displayed_images if mime == "image/png"]
    if not pngs:
        return []
    try:
        return images_from_png(pngs)
    except Exception as exc:  # the sandbox made these bytes: a figure that cannot be read is not shown
        logger.warning("a step's figures could not be read and are not shown: %s: %s", type(exc).__name__, exc)
        return []


def _logs(result: pynox.Result, max_length: int) -> str:
    """What the step printed: stdout, then stderr if any, cut to ``max_length`` as smolagents cuts its own
    executor's prints, then notes a model needs."""
    logs = result.stdout
    if result.stderr and result.ok:
        logs += ("" if not logs or logs.endswith("\n") else "\n") + result.stderr
    logs = str(truncate_content(logs, max_length=max_length))
    if result.truncated:
        logs += "\n[Output was truncated: print a summary instead of everything.]"
    if result.session_ended and result.ok:  # exit(): a failed step says it in its error instead
        logs += ("\n[The session ended with this step: variables, imports and functions defined so far are "
                 "gone; tools are still callable.]")
    return logs


def _as_the_model_wrote(result: pynox.Result, wrapped: str, code: str, name: str) -> pynox.Result:
    """``result`` with each traceback line of the step's own code as the model wrote it: the wrapper of its
    trailing expression (``__pynox_emit__(...)``) is ours, and the model must read its own line."""
    error = result.error
    if wrapped == code or error is None or not error.get("traceback"):
        return result
    originals, ours = code.split("\n"), wrapped.split("\n")
    frames = []
    for frame in error["traceback"]:
        line = frame.get("line")
        if frame.get("file") == name and isinstance(line, int) and 0 < line <= min(len(ours), len(originals)) \
                and ours[line - 1] != originals[line - 1] and frame.get("source") is not None:
            frame = {**frame, "source": originals[line - 1]}
        frames.append(frame)
    return dataclasses.replace(result, error={**error, "traceback": frames})


def _wrap_trailing_expression(code: str) -> str:
    """``code`` with its last top-level statement, if an expression, wrapped as ``__pynox_emit__(expr)``.

    A text splice at the expression's own position, not a recompile: every line keeps its number.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code  # the sandbox reports it, with the model's own line
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    node = tree.body[-1].value
    if node.end_lineno is None or node.end_col_offset is None:
        return code
    lines = code.split("\n")
    try:
        # ast offsets count UTF-8 bytes, not characters.
        end = lines[node.end_lineno - 1].encode()
        lines[node.end_lineno - 1] = (end[:node.end_col_offset] + b")" + end[node.end_col_offset:]).decode()
        start = lines[node.lineno - 1].encode()
        lines[node.lineno - 1] = (start[:node.col_offset] + _EMIT.encode() + b"(" + start[node.col_offset:]).decode()
        last = ast.parse("\n".join(lines)).body[-1]
    except (IndexError, UnicodeDecodeError, SyntaxError, ValueError):
        return code  # a line break other than "\n" (a lone "\r") moved the splice: leave the code as it was
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name)
            and last.value.func.id == _EMIT and ast.dump(last.value.args[0]) == ast.dump(node)):
        return code
    return "\n".join(lines)
