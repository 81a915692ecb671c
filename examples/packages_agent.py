"""An agent that asks for a package and then uses it, offline: a scripted model stands in for the LLM.

The operator's pool installs packages from a wheelhouse it names (``[pool] find_links``), wheels only, and
only those its ceiling allows (``[pool.limits] packages``). Here the wheelhouse is made on the spot, with one
small wheel (``tinystats``), as an organisation's mirror of approved wheels would hold it.

The model's first call imports ``tinystats``, which is not installed: the error's hint tells it that the
host can grant ``packages=["tinystats"]``. The model asks; the host gives the agent a toolset with that
grant; the pool installs the wheel once, into a read-only environment, and the model's code imports it.
The code itself never installs anything: it has no network, and ``pip`` does not run in it.

For a real model, replace ``FunctionModel(...)`` with e.g. ``"anthropic:claude-sonnet-4-5"``.

    python examples/packages_agent.py
"""

from __future__ import annotations

import base64
import hashlib
import tempfile
import zipfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pynox
from pynox_pydantic_ai import PynoxToolset

CODE = "import tinystats\nprint(tinystats.trimmed_mean([3, 4, 5, 100], cut=1))"
TINYSTATS = '''def trimmed_mean(values, cut):
    """The mean of ``values`` without the ``cut`` smallest and largest."""
    kept = sorted(values)[cut:len(values) - cut]
    return sum(kept) / len(kept)
'''


def make_wheelhouse(directory: Path) -> None:
    """One pure-Python wheel, written as any build tool would: its module, METADATA, WHEEL and RECORD."""
    files = {"tinystats/__init__.py": TINYSTATS.encode(),
             "tinystats-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinystats\nVersion: 1.0\n",
             "tinystats-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = {path: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
              for path, data in files.items()}
    record = "".join(f"{path},sha256={digest[path]},{len(data)}\n" for path, data in files.items())
    files["tinystats-1.0.dist-info/RECORD"] = (record + "tinystats-1.0.dist-info/RECORD,,\n").encode()
    with zipfile.ZipFile(directory / "tinystats-1.0-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Runs CODE; if the module is missing, asks for the grant the hint names; else answers."""
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    if not returned:
        print("model (scripted) calls run_python:\n" + "\n".join(f"    {line}" for line in CODE.splitlines()))
        return ModelResponse(parts=[ToolCallPart("run_python", {"code": CODE})])
    last = returned[-1]
    text = str(last.content)
    if last.outcome == "failed":
        first, _, hint = text.partition("\n")
        # The hint also lists what is importable here (this machine's packages): the part that matters.
        asked = hint[hint.index("Ask the host"):hint.index(" (the pool")]
        print(f"run_python [failed]:\n    {first}\n    hint: ... {asked}")
        answer = 'I need the tinystats package: please grant packages=["tinystats"].'
    else:
        print(f"run_python [success]:\n    {text}")
        answer = f"The trimmed mean is {text}."
    print(f"model (scripted): {answer}")
    return ModelResponse(parts=[TextPart(answer)])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pynox-packages-") as root:
        wheelhouse = Path(root, "wheelhouse")
        wheelhouse.mkdir()
        make_wheelhouse(wheelhouse)
        config = Path(root, "pynox.toml")
        config.write_text(f'[pool]\nfind_links = ["{wheelhouse}"]\npackages_dir = "{root}/packages"\n\n'
                          '[pool.limits]\npackages = ["tinystats"]\n')
        print("host: the pool installs wheels from its wheelhouse; its ceiling allows tinystats")
        with pynox.Pool(workers=1, config=config) as pool:
            agent = Agent(FunctionModel(scripted), toolsets=[PynoxToolset(pool)])
            agent.run_sync("What is the trimmed mean of 3, 4, 5 and 100? Use tinystats.")
            print('host: granting packages=["tinystats"]')
            toolset = PynoxToolset(pool, packages=["tinystats"])
            said = next(line for line in toolset.description.splitlines() if line.startswith("- Installed"))
            print(f"host: the tool's description now says: {said[2:]}")
            Agent(FunctionModel(scripted), toolsets=[toolset]).run_sync("Now try again.")


if __name__ == "__main__":
    main()
