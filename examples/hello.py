"""Hello from every place.

    python examples/hello.py               # 4 places, as set below
    python -m apgas -n 3 examples/hello.py # 3 places, from the shell
"""

import apgas


def report(ref: apgas.GlobalRef) -> None:
    line = f"hello from {apgas.here()}"
    apgas.at(ref.home, lambda: ref.get().append(line))  # back home, into place 0's list


def main() -> None:
    lines: list[str] = []
    ref = apgas.GlobalRef(lines)  # a reference to the list that can travel
    with apgas.finish():          # waits for every task below, on every place
        for p in apgas.places():
            apgas.async_at(p, report, ref)
    print("\n".join(sorted(lines)))
    last = apgas.places()[-1]
    print(f"sum of squares computed at {last}:", apgas.at(last, sum, [i * i for i in range(10)]))


if __name__ == "__main__":
    apgas.run(main, places=4)
