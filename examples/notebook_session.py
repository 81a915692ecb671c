"""A notebook-style tool: variables defined in one call are there in the next.

The session is one confined process that lives between calls. A Python error
leaves it alive, like a failed notebook cell; a timeout or crash replaces it
(the tool's text says so) and the next call starts fresh.

    python examples/notebook_session.py
"""

import pynox

notebook = pynox.tool(session=True, timeout="5s")

if __name__ == "__main__":
    print(notebook("orders = [12.5, 8.0, 30.25]\ntotal = sum(orders)"))
    print(notebook("print(f'{len(orders)} orders, total {total}')"))
    print(notebook("print(undefined_name)"))  # an error: the session survives it
    print(notebook("print('still here:', total)"))
    print(notebook("while True:\n    pass"))  # a timeout ends the session
    print(notebook("print('total' in globals())"))
