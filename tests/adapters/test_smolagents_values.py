"""Values between a ``CodeAgent`` and its Pynox session, with smolagents' own serialization semantics.

Through the agent's real loop with a scripted model: the agent's variables (``additional_args``) go in, the
code hands them to a host tool that hands them back, and the final answer comes out; each object is compared
with the one sent, on both sides. Then what a hostile sandbox can send the host's reader.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import io
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from smolagents import CodeAgent, tool
from smolagents.agent_types import AgentImage
from smolagents.memory import ActionStep
from smolagents.utils import truncate_content

import pynox
from pynox_smolagents import PynoxExecutor
from tests.adapters.test_smolagents import QUIET, ScriptedModel, action_steps
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)


@dataclasses.dataclass
class Point:
    x: int
    y: str


def sample_values() -> dict[str, Any]:
    frame = pd.DataFrame({"product": ["lamp", "desk", None], "price": [25.0, None, 12.5], "count": [1, 2, 3],
                          "sold": pd.to_datetime(["2026-01-02", None, "2026-03-04"]), "open": [True, False, True]},
                         index=pd.Index(["a", "b", "c"], name="sku"))
    return {
        "frame": frame,
        "series": frame["price"],
        "array": np.arange(12, dtype=np.int32).reshape(3, 4),
        "floats": np.array([1.5, np.nan, -np.inf]),
        "image": Image.new("RGB", (5, 3), (200, 10, 30)),
        "pair": (1, "a", (2.5, None)),
        "tags": {"red", "blue"},
        "frozen": frozenset({3, 4}),
        "blob": b"\x00\xffpynox",
        "when": datetime.datetime(2026, 12, 1, 17, 30, 5, 123456),
        "day": datetime.date(2026, 12, 1),
        "span": datetime.timedelta(hours=1, seconds=3),
        "amount": decimal.Decimal("10.10"),
        "where": Path("/data/orders.csv"),
        "keyed": {(1, 2): "tuple key", 3: "int key"},
        "point": Point(1, "q"),
        "nothing": None,
    }


def same(sent: Any, arrived: Any) -> bool:
    """Whether ``arrived`` is ``sent`` as smolagents' serializer brings it back."""
    if isinstance(sent, (pd.DataFrame, pd.Series)):
        return type(arrived) is type(sent) and bool(sent.equals(arrived)) and sent.index.name == arrived.index.name
    if isinstance(sent, np.ndarray):
        return (type(arrived) is np.ndarray and arrived.dtype == sent.dtype
                and bool(np.array_equal(sent, arrived, equal_nan=sent.dtype.kind == "f")))
    if isinstance(sent, Image.Image):
        return isinstance(arrived, Image.Image) and arrived.size == sent.size and \
            arrived.convert(sent.mode).tobytes() == sent.tobytes()
    if dataclasses.is_dataclass(sent):  # smolagents: a dict naming its class
        return arrived == {"__dataclass__": type(sent).__name__, "__module__": type(sent).__module__,
                           **dataclasses.asdict(sent)}
    return type(arrived) is type(sent) and arrived == sent


# The same comparison, in the sandbox (smolagents' semantics: a dataclass is a dict there already).
SAME_IN_SANDBOX = """\
import numpy as np, pandas as pd
from PIL import Image

def same(a, b):
    if isinstance(a, (pd.DataFrame, pd.Series)):
        return type(a) is type(b) and bool(a.equals(b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, Image.Image):
        return a.size == b.size and a.tobytes() == b.convert(a.mode).tobytes()
    return type(a) is type(b) and a == b
"""

RECEIVED: dict[str, Any] = {}


@tool
def keep(name: str, value: Any) -> Any:
    """Keep a value under a name, and give it back.

    Args:
        name: What to call it.
        value: Any value.
    """
    RECEIVED[name] = value
    return value


pool = shared_pool(workers=1)


def test_values_cross_into_the_code_through_a_tool_and_back_out_as_the_answer(pool: pynox.Pool) -> None:
    sent = sample_values()
    names = sorted(sent)
    RECEIVED.clear()
    model = ScriptedModel([
        SAME_IN_SANDBOX
        + f"names = {names!r}\n"
        + "for name in names:\n"
        + "    value = globals()[name]\n"
        + "    back = keep(name, value)\n"
        + "    print(name, type(value).__name__, same(value, back))\n",
        "final_answer(tuple(globals()[name] for name in names))",
    ])
    with CodeAgent(tools=[keep], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        answer = agent.run("Keep every value", additional_args=sent)
        logs = action_steps(agent)[0].observations or ""

    # In the sandbox: each variable arrived as its own type, and the tool's result came back as it went.
    arrived_types = {line.split()[0]: line.split()[1:] for line in logs.splitlines()[1:] if line.split()[:1]
                     and line.split()[0] in sent}
    # smolagents' semantics: a dataclass arrives as a dict naming its class, an image as the PNG it crossed as.
    expected_types = {name: type(value).__name__ for name, value in sent.items()} | {"point": "dict",
                                                                                      "image": "PngImageFile"}
    assert {name: kinds[0] for name, kinds in arrived_types.items()} == expected_types, logs
    assert all(kinds[1] == "True" for kinds in arrived_types.values()), logs
    # On the host: the tool got each object, and the final answer holds them all.
    assert sorted(RECEIVED) == names
    assert [name for name in names if not same(sent[name], RECEIVED[name])] == []
    assert isinstance(answer, tuple) and len(answer) == len(names)
    assert [name for name, value in zip(names, answer, strict=True) if not same(sent[name], value)] == []


def test_a_tool_returning_a_frame_and_a_trailing_frame_value(pool: pynox.Pool) -> None:
    frame = sample_values()["frame"]

    @tool
    def orders() -> Any:
        """The orders table.
        """
        return frame

    model = ScriptedModel(["table = orders()\nprint(type(table).__name__, table.shape)\ntable.head(2)",
                           "final_answer(table['price'].sum())"])
    with CodeAgent(tools=[orders], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("total price") == 37.5
        first = action_steps(agent)[0]
    assert "DataFrame (3, 5)" in (first.observations or "")
    assert same(frame.head(2), first.action_output)  # the step's value is the object, as in the local executor


def test_an_image_answer_is_an_agent_image(pool: pynox.Pool) -> None:
    model = ScriptedModel(["from PIL import Image\nfinal_answer(Image.new('RGB', (8, 4), (0, 128, 255)))"])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        answer = agent.run("draw")
    assert isinstance(answer, AgentImage)
    assert answer.to_raw().size == (8, 4) and answer.to_raw().convert("RGB").getpixel((1, 1)) == (0, 128, 255)


def test_open_figures_are_kept_as_the_steps_images(pool: pynox.Pool) -> None:
    executor = PynoxExecutor(pool)
    model = ScriptedModel(["import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('drawn')",
                           "final_answer('done')"])
    with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=QUIET) as agent:
        seen: list[Any] = []
        agent.step_callbacks.register(ActionStep, lambda step, agent: seen.append(list(executor.step_images)))
        assert agent.run("plot") == "done"
    assert len(seen[0]) == 1 and isinstance(seen[0][0], Image.Image) and seen[0][0].format == "PNG"
    assert seen[1] == []  # the next step drew nothing


def test_variables_of_types_that_cannot_cross_are_refused_before_the_step(pool: pynox.Pool) -> None:
    agent = CodeAgent(tools=[], model=ScriptedModel([]), executor=PynoxExecutor(pool), verbosity_level=QUIET)
    with pytest.raises(TypeError, match=r"'lock' \(lock\), 'objects' \(ndarray\)\. It sends"):
        agent.run("task", additional_args={"lock": __import__("threading").Lock(),
                                           "objects": np.array([object()], dtype=object)})
    agent.cleanup()


def test_max_print_outputs_length_cuts_as_smolagents_does(pool: pynox.Pool) -> None:
    printed = "0123456789" * 500 + "\n"
    for limit, expected in ((50, truncate_content(printed, max_length=50)), (None, printed)):
        model = ScriptedModel([f"print({printed[:-1]!r})", "final_answer(1)"])
        executor = PynoxExecutor(pool, max_print_outputs_length=limit)
        with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=QUIET) as agent:
            agent.run("print")
            assert action_steps(agent)[0].observations == f"Execution logs:\n{expected}Last output from code " \
                "snippet:\nNone"
    with pytest.raises(ValueError, match="max_print_outputs_length must be a positive int"):
        PynoxExecutor(pool, max_print_outputs_length=0)


# -- what a hostile sandbox can send the host's reader -----------------------------------------------------------

def run_direct(pool: pynox.Pool, payload: str) -> tuple[str, list[Any]]:
    """Call the host side of ``keep`` with a raw payload, bypassing the sandbox's own writer; what the code
    printed, and what the tool received."""
    RECEIVED.clear()
    model = ScriptedModel([f"import pynox_host\ntry:\n    pynox_host.keep(['v', {payload}])\n"
                           "except pynox_host.HostError as error:\n    print('refused:', error)",
                           "final_answer('ok')"])
    with CodeAgent(tools=[keep], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        agent.run("task")
        logs = action_steps(agent)[0].observations or ""
    return logs, list(RECEIVED.values())


def test_a_wide_string_dtype_does_not_allocate_on_the_host(pool: pynox.Pool) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logs, received = run_direct(pool, "{'__type__': 'ndarray', 'data': ['a', 'b'], 'dtype': '<U50000000'}")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: the marker asked 400 MB
    assert len(received) == 1 and received[0].dtype == np.dtype("<U1"), logs


@pytest.mark.parametrize(("payload", "refusal"), [
    ("{'__type__': 'ndarray', 'data': [1], 'dtype': 'O'}", "dtype object cannot cross"),
    ("{'__type__': 'PIL.Image', 'data': __import__('base64').b64encode(b'GIF89a' + bytes(40)).decode()}",
     "could not be read"),
    ("{'__type__': 'bytes', 'data': '***'}", "could not be read"),
    ("{'__type__': 'tuple', 'data': 5}", "needs a list"),
    ("{'__type__': 'DataFrame', 'columns': 1}", "could not be read"),
])
def test_a_malformed_value_is_a_host_error_in_the_code_and_never_reaches_the_tool(
        pool: pynox.Pool, payload: str, refusal: str) -> None:
    logs, received = run_direct(pool, payload)
    assert received == []
    assert "refused: keep(): a value the code sent could not be read" in logs and refusal in logs, logs


def test_a_legitimate_payload_through_the_same_path_reaches_the_tool(pool: pynox.Pool) -> None:
    """The control for the two tests above: the direct call itself works."""
    logs, received = run_direct(pool, "{'__type__': 'tuple', 'data': [1, 2]}")
    assert received == [(1, 2)], logs


def test_a_png_from_the_sandbox_is_opened_only_as_png(pool: pynox.Pool) -> None:
    buffer = io.BytesIO()
    Image.new("L", (2, 2), 7).save(buffer, format="PNG")
    png = base64.b64encode(buffer.getvalue()).decode()
    logs, received = run_direct(pool, f"{{'__type__': 'PIL.Image', 'data': {png!r}}}")
    assert len(received) == 1 and received[0].format == "PNG" and received[0].getpixel((0, 0)) == 7, logs


# -- found by review: what a few bytes may ask of the host, and calls racing the final answer -------------------

def host_peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize(("payload", "refusal"), [
    # numpy gives every item the longest one's width: 6,000 empty strings beside one of 60,000 characters.
    ("{'__type__': 'ndarray', 'data': ['x' * 60_000] + [''] * 6000, 'dtype': '<U1'}", "this array would take"),
    # a blank 9,459 x 9,459 one-bit PNG: 15 KB of base64, 89 MB of pixels.
    ("{'__type__': 'PIL.Image', 'data': __import__('base64').b64encode(BOMB).decode()}", "this image would take"),
])
def test_a_value_that_would_be_huge_in_memory_is_refused_before_it_exists(
        pool: pynox.Pool, payload: str, refusal: str) -> None:
    before = host_peak_kb()
    logs, received = run_direct(pool, payload.replace("BOMB", BOMB_CODE))
    assert received == [] and refusal in logs, logs
    assert host_peak_kb() - before < 40_000  # KiB: the values asked for 1.4 GB and 89 MB


BOMB_CODE = ("(lambda io, Image: (lambda b: (Image.new('1', (9459, 9459)).save(b, format='PNG', optimize=True), "
             "b.getvalue())[1])(io.BytesIO()))(__import__('io'), __import__('PIL.Image').Image)")


def test_a_column_dtype_is_rebuilt_only_among_the_plain_ones(pool: pynox.Pool) -> None:
    """A Series marker naming a numpy bytes dtype 100 MB wide arrives as a Series of its values, not 2 GB."""
    before = host_peak_kb()
    logs, received = run_direct(pool, "{'__type__': 'Series', 'name': None, 'data': ['x'] * 20, 'dtype': "
                                      "'S100000000', 'index': {'values': list(range(20)), 'names': [None], "
                                      "'dtype': 'int64'}}")
    assert len(received) == 1 and list(received[0]) == ["x"] * 20, logs
    assert received[0].dtype.kind != "S" and host_peak_kb() - before < 40_000


@pytest.mark.parametrize("payload", [
    "{'__type__': 'Decimal', 'data': 'abc'}",
    "{'__type__': 'timedelta', 'total_seconds': 1e300}",
    "{'__type__': 'datetime', 'data': 'yesterday'}",
])
def test_any_failure_to_rebuild_is_a_host_error_naming_the_tool(pool: pynox.Pool, payload: str) -> None:
    logs, received = run_direct(pool, payload)
    assert received == [] and "refused: keep(): a value the code sent could not be read" in logs, logs


PAID: list[float] = []


@tool
def pay(amount: int) -> str:
    """Pay an amount, slowly.

    Args:
        amount: How much.
    """
    time.sleep(0.5)
    PAID.append(time.monotonic())
    return "paid"


def test_racing_final_answers_reach_the_tool_once_and_the_first_one_wins(pool: pynox.Pool) -> None:
    answered: list[Any] = []

    @tool
    def final_answer(answer: Any) -> Any:
        """Give the final answer.

        Args:
            answer: The answer.
        """
        answered.append(answer)
        time.sleep(0.05)
        return answer

    race = ("import threading, pynox_host\ngo = threading.Barrier(8)\ndef answer(i):\n    go.wait()\n    try:\n"
            "        pynox_host.final_answer([i], {})\n    except BaseException:\n        pass\n"
            "threads = [threading.Thread(target=answer, args=(i,)) for i in range(8)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]")
    executor = PynoxExecutor(pool)
    executor.send_tools({"final_answer": final_answer})
    try:
        output = executor(race)
    finally:
        executor.cleanup()
    assert len(answered) == 1 and output.is_final_answer and output.output == answered[0]


def test_a_tool_call_in_flight_ends_before_the_step_and_a_left_thread_reaches_no_tool(pool: pynox.Pool) -> None:
    PAID.clear()
    executor = PynoxExecutor(pool)
    executor.send_tools({"pay": pay, "final_answer": keep})
    try:
        output = executor("import threading, time\nthreading.Thread(target=lambda: pay(1), daemon=True).start()\n"
                          "time.sleep(0.1)\nprint('answering')")
        returned = time.monotonic()
        assert len(PAID) == 1 and PAID[0] <= returned  # the call begun in the step ended within it
        # A session keeps its threads: one the last step left behind calls a tool between steps.
        executor("import threading, time\ndef later():\n    time.sleep(1.0)\n    pay(2)\n"
                 "threading.Thread(target=later, daemon=True).start()")
        time.sleep(1.5)
        assert len(PAID) == 1, "a thread of an ended step reached a tool"
    finally:
        executor.cleanup()
    assert output.logs == "answering\n"
