"""apgas.steps commits inside a grow (issue 53, item 4): a loss after a grow undoes
no step before it. Written as a user writes a program: a followed, resilient array,
a handler, a loop without ``commit_every`` (commits only where the loop must)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from orders import Newest, order

import apgas
from apgas.arrays import BlockArray, at_each

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_scheduler")]


def add_one(a: BlockArray) -> None:
    a.local()[...] += 1.0


def test_a_loss_after_a_grow_rolls_back_to_the_grow_not_to_step_0(malleable_address):
    x = np.arange(120.0 * 2).reshape(120, 2)

    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.from_array(x, follow=True, resilient=True)
        ran, replies, killed = [], [], []
        grow = threading.Thread(target=lambda: replies.append(order(malleable_address, "grow 1 node1")))
        for step in apgas.steps(10, arrays=[a]):
            with step:
                ran.append(step.index)
                if step.index == 6 and not killed:
                    killed.append(apgas.places()[-1].id)  # the place the grow added
                    os.kill(apgas.at(killed[0], os.getpid), signal.SIGKILL)
                at_each(apgas.places(), add_one, a)
                if step.index == 2 and grow.ident is None:
                    grow.start()  # carried out at this step's end
            if step.index == 2 and not replies:
                grow.join(60)  # the grow took place between steps 2 and 3
                assert len(apgas.places()) == 3, replies
        result = a.gather()
        a.free()
        return ran, result, replies + [killed]

    ran, result, replies = apgas.run(main, places=2)
    assert replies[0][0].startswith("ok grow 1"), replies
    np.testing.assert_array_equal(result, x + 10)
    assert ran == [*range(7), *range(3, 10)], f"steps run: {ran} (the grow came before step 3)"
