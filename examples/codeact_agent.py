"""A CodeAct agent: the model's code calls the application's own functions, many times, in one run.

The model is SCRIPTED (LangChain's fake chat model playing fixed replies): no model service is
reachable here. The loop is pynox-langchain's ``create_codeact_graph`` (LangGraph); the code runs in a
Pynox session with no file or network access at all. ``customers`` and ``orders`` run here, in the
host, over an SQLite database the sandboxed code can never open itself: it only calls the two
functions, as globals, and every call crosses back to this process.

    python examples/codeact_agent.py
"""

from __future__ import annotations

import sqlite3
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage

import pynox
from pynox_langchain import PynoxEval, create_codeact_graph

DB = sqlite3.connect(":memory:", check_same_thread=False)  # host calls arrive on the pool client's threads
DB.executescript("""
create table customer (id integer primary key, name text, city text);
create table orders (customer integer, total real);
insert into customer values (1, 'Ada', 'Lyon'), (2, 'Bo', 'Lyon'), (3, 'Cy', 'Nice');
insert into orders values (1, 120.0), (1, 80.5), (2, 42.0), (3, 300.0);
""")
CALLS: list[str] = []


def customers(city: str) -> list[dict[str, Any]]:
    """The customers of one city: id and name."""
    CALLS.append(f"customers({city!r})")
    rows = DB.execute("select id, name from customer where city = ?", (city,)).fetchall()
    return [{"id": row[0], "name": row[1]} for row in rows]


def orders(customer_id: int) -> list[float]:
    """The totals of one customer's orders, in euros."""
    CALLS.append(f"orders({customer_id})")
    return [row[0] for row in DB.execute("select total from orders where customer = ?", (customer_id,))]


QUESTION = "How much have our Lyon customers spent, each and together?"
SCRIPT = """spent = {c["name"]: sum(orders(c["id"])) for c in customers("Lyon")}
for name, total in spent.items():
    print(f"{name}: {total:.2f} EUR")
print(f"together: {sum(spent.values()):.2f} EUR")"""
REPLIES = [
    AIMessage(f"I'll look them up and add their orders.\n```python\n{SCRIPT}\n```"),
    AIMessage("Ada spent 200.50 EUR and Bo 42.00 EUR: 242.50 EUR together."),
]


def main() -> None:
    with pynox.Pool(workers=1) as pool:
        evaluate = PynoxEval(pool, timeout="10s")
        graph = create_codeact_graph(FakeMessagesListChatModel(responses=REPLIES), [customers, orders],
                                     evaluate).compile()
        final = graph.invoke({"messages": [HumanMessage(QUESTION)]})
        evaluate.close()
    for message in final["messages"]:
        who = "model (scripted)" if isinstance(message, AIMessage) else "user"
        if message is not final["messages"][0] and isinstance(message, HumanMessage):
            who = "sandbox output"
        print(f"{who}:")
        print("\n".join(f"    {line}" for line in str(message.content).splitlines()))
    print(f"host functions called during the one script: {len(CALLS)}: {', '.join(CALLS)}")


if __name__ == "__main__":
    main()
