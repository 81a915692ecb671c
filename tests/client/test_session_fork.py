"""``Session.fork()`` through the Python API against the real pool (see tests/pool/test_pool_session_fork.py for
the protocol, the gate and the processes seen from outside)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pynox import Pool, RequestError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool(workers=1, max_sessions=6) as pool:
        yield pool


def test_a_tree_search_branches_a_state_three_ways(pool: Pool) -> None:
    with pool.session(memory="256m") as root:
        root.run("import itertools\nstate = {'path': [], 'score': 0}\ncounter = itertools.count()\n"
                 "next(counter)").raise_for_error()
        branches = [root.fork() for _ in range(3)]
        try:
            for move, branch in enumerate(branches):
                assert branch.alive and branch.grants == root.grants
                branch.run(f"state['path'].append({move})\nstate['score'] += {10 * (move + 1)}\n"
                           "step = next(counter)").raise_for_error()
            seen = [branch.run("(state, step)").return_value for branch in branches]
            assert seen == [f"({{'path': [{move}], 'score': {10 * (move + 1)}}}, 1)" for move in range(3)], seen
            assert root.run("(state, next(counter))").return_value == "({'path': [], 'score': 0}, 1)"
            # A branch of a branch: the search goes deeper from any node.
            deeper = branches[0].fork()
            deeper.run("state['path'].append(9)").raise_for_error()
            assert deeper.run("state['path']").return_value == "[0, 9]"
            assert branches[0].run("state['path']").return_value == "[0]"
            deeper.close()
        finally:
            for branch in branches:
                branch.close()
        # The original lives on after its branches closed.
        assert root.run("state['score']").return_value == "0"


def test_a_session_without_a_process_cannot_be_forked(pool: Pool) -> None:
    with pool.session() as session, pytest.raises(RequestError, match="run a step first"):
        session.fork()


def test_a_session_with_a_scratch_directory_is_refused(pool: Pool) -> None:
    with pool.session(scratch=True) as session:
        session.run("x = 1").raise_for_error()
        with pytest.raises(RequestError, match="scratch directory"):
            session.fork()
        assert session.run("x").return_value == "1"


def test_afork(pool: Pool) -> None:
    async def main() -> tuple[str | None, str | None]:
        with pool.session() as session:
            await session.arun("x = 5")
            copy = await session.afork()
            with copy:
                await copy.arun("x += 1")
                return (await session.arun("x")).return_value, (await copy.arun("x")).return_value

    assert asyncio.run(main()) == ("5", "6")


def test_a_session_with_host_functions_forks_with_a_channel_of_its_own(pool: Pool) -> None:
    calls: list[tuple[str, int]] = []

    def record(who: str, n: int) -> int:
        calls.append((who, n))
        return n * 10

    with pool.session(functions={"record": record}, host_globals="call") as session:
        session.run("from pynox_host import record\nseen = [record('root', 1)]").raise_for_error()
        copy = session.fork()
        with copy:
            copy.run("seen.append(record('copy', 2))").raise_for_error()
            session.run("seen.append(record('root', 3))").raise_for_error()
            assert copy.run("seen").return_value == "[10, 20]"
            assert session.run("seen").return_value == "[10, 30]"
    assert calls == [("root", 1), ("copy", 2), ("root", 3)]
