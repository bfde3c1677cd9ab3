"""Run a notebook in a real ipykernel through nbclient, as tests/test_notebook.py needs:
the cell tagged ``raises-exception`` is interrupted once it prints that its tasks run
at every place, as the stop button does it. Prints one ``RESULT <json>`` line."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import nbclient
import nbformat

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests._leaks import place_processes  # noqa: E402


def text(cell) -> str:
    return "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.outputs)


def main(path: str) -> None:
    # the kernel takes SIGINT as a terminal's shell leaves it (a pytest-xdist worker
    # ignores it, and an ignored signal stays ignored across exec)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    times: dict[str, float] = {}

    def interrupt_when_running(cell) -> None:
        deadline = time.monotonic() + 60
        while "running at every place" not in text(cell):  # the cell's outputs, as they come
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        times["at"] = time.monotonic()
        # what the stop button does (jupyter_client's interrupt_kernel for an ipykernel):
        # SIGINT to the kernel's process group, to which the places belong (they ignore it)
        os.killpg(client.km.provisioner.pgid, signal.SIGINT)

    def interrupted(cell) -> bool:
        return "raises-exception" in cell.metadata.get("tags", [])

    def on_cell_execute(cell, cell_index, **kwargs) -> None:
        if interrupted(cell):
            threading.Thread(target=interrupt_when_running, args=(cell,), daemon=True).start()

    def on_cell_executed(cell, cell_index, execute_reply, **kwargs) -> None:
        if interrupted(cell):
            times["returned"] = time.monotonic()

    client.on_cell_execute = on_cell_execute
    client.on_cell_executed = on_cell_executed
    with client.setup_kernel():
        kernel_pid = client.km.provisioner.process.pid
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)
        places_after = place_processes(kernel_pid)  # the last cell shut the session down
    [cell] = [c for c in nb.cells if c.cell_type == "code" and interrupted(c)]
    errors = [o.ename for o in cell.outputs if o.output_type == "error"]
    print("RESULT " + json.dumps({
        "outputs": [text(c) for c in nb.cells if c.cell_type == "code"],
        "kernel_pid": kernel_pid, "interrupt_error": errors[0] if errors else None,
        "interrupt_returned_s": times.get("returned", 0) - times.get("at", 0),
        "places_after": places_after}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
