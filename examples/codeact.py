"""CodeAct: the model's code chains the application's own functions in one run.

`search` and `price` run in this process (they could reach a database or an
API); the sandboxed code calls them through `pynox_host` and cannot reach
anything else. One tool call does what would otherwise take several turns.

    python examples/codeact.py
"""

import pynox

CATALOG = {"lamp": 25.0, "desk": 180.0, "chair": 95.0, "lamp shade": 12.0}


def search(query: str, limit: int = 5) -> list[str]:
    """Search the product catalog; returns product names."""
    return [name for name in CATALOG if query in name][:limit]


def price(product: str) -> float:
    """The price of one product, in euros."""
    if product not in CATALOG:
        raise pynox.HostError(f"no product named {product!r}")  # its message is meant for the model
    return CATALOG[product]


run_python = pynox.tool(functions={"search": search, "price": price})

# What a model might write for "what do all lamp products cost together?"
MODEL_CODE = """
from pynox_host import search, price, HostError
names = search("lamp")
total = sum(price(name) for name in names)
print(f"{len(names)} products: {', '.join(names)}; total {total:.2f} EUR")
try:
    price("sofa")
except HostError as error:
    print("host said:", error)
"""

if __name__ == "__main__":
    print(run_python(MODEL_CODE))
