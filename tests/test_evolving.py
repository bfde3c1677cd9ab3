"""Evolving programs against a scripted scheduler on a raw socket: request_grow,
release_places, check_status, and every refusal and misuse."""

from __future__ import annotations

import time

import pytest

import apgas
from apgas import ApgasError, DeadPlaceError, GrowRefused
from apgas.testing import FakeScheduler

pytestmark = pytest.mark.timeout(90)


class Handler(apgas.MalleableHandler):
    """Releases the newest places or the chosen ones; records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pre_shrink(self, n, chosen=None):
        self.calls.append(("pre_shrink", n, None if chosen is None else [p.id for p in chosen]))
        return chosen if chosen is not None else apgas.places()[-n:]

    def post_shrink(self, n, removed):
        self.calls.append(("post_shrink", n, [p.id for p in removed]))

    def post_grow(self, n, continued, added):
        self.calls.append(("post_grow", n, [p.id for p in added]))


class OrdersOnly(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def ready(fake: FakeScheduler) -> None:
    """The scheduler has seen APGAS-Ready: orders are welcome."""
    wait_for(lambda: any(line.startswith("APGAS-Ready") for line in fake.lines))


# -- request_grow ------------------------------------------------------------------------

def test_request_grow_is_granted_by_later_grow_orders(fake_scheduler):
    def script(message, fake):
        if message.startswith("Evolving;Request;2"):
            fake.later("grow 1 nodeA", "grow 1 nodeB")  # node by node, as evolving EASY does
            return "ok 2"
        return None

    fake = fake_scheduler(script)

    def main():
        handler = Handler()
        apgas.define_malleable_handler(handler)
        request = apgas.request_grow(2)
        added = request.result(timeout=30)
        assert request.state == "granted" and request.done()
        assert [p.host for p in added] == ["nodeA", "nodeB"]
        assert [p.id for p in apgas.places()] == [0, 1, 2]
        assert apgas.at(added[1], lambda: apgas.here().id) == 2
        return handler.calls

    calls = apgas.run(main, places=1)
    assert calls == [("post_grow", 1, [1]), ("post_grow", 1, [2])]
    assert fake.messages() == ["Evolving;Request;2"]
    fake.join()
    assert fake.replies == [["ok grow 1 places 1"], ["ok grow 1 places 2"]]


def test_a_refused_request_is_observed_and_the_program_goes_on(fake_scheduler):
    fake_scheduler(lambda m, f: "error job 1 asks for 9 more node(s) but holds 1 and may have at most 4"
              if m.startswith("Evolving;Request") else None)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(9)
        with pytest.raises(GrowRefused, match="may have at most 4") as caught:
            request.result(timeout=20)
        assert request.state == "refused" and caught.value.added == []
        assert "at most 4" in request.reason
        return apgas.at(apgas.place(1), lambda: "still here")

    assert apgas.run(main, places=2) == "still here"


def test_a_refuse_order_ends_a_partly_granted_request(fake_scheduler):
    def script(message, fake):
        if message.startswith("Evolving;Request;3"):
            fake.later("grow 1 nodeA", "refuse 2 the job reached its maximum of 2 nodes")
            return "ok 3"
        return None

    fake = fake_scheduler(script)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(3)
        assert request.wait(30)
        with pytest.raises(GrowRefused, match="maximum of 2 nodes") as caught:
            request.result()
        return [p.host for p in caught.value.added], len(apgas.places())

    assert apgas.run(main, places=1) == (["nodeA"], 2)
    fake.join()
    assert fake.replies[1] == ["ok refuse 2"]


def test_a_request_pending_at_the_end_is_refused_and_waits_nobody(fake_scheduler):
    fake_scheduler(lambda m, f: "ok 1" if m.startswith("Evolving;Request") else None)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(1)
        with pytest.raises(TimeoutError, match="still pending"):
            request.result(timeout=0.3)
        apgas.disable_malleable_handler()
        return request.state, request.reason

    assert apgas.run(main, places=1) == ("refused", "the program disabled its malleable handler")


# -- release_places ----------------------------------------------------------------------

def test_release_places_drains_through_the_handler_and_returns_the_hosts(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_HOSTS", "n0,n1,n2,n3")
    fake = fake_scheduler(lambda m, f: None)

    def main():
        handler = Handler()
        apgas.define_malleable_handler(handler)
        hosts = apgas.release_places([apgas.place(2), 3])
        assert [p.id for p in apgas.places()] == [0, 1]
        with pytest.raises(DeadPlaceError):
            apgas.async_at(2, print)
        return hosts, handler.calls

    hosts, calls = apgas.run(main)
    assert hosts == ["n2", "n3"]
    assert calls == [("pre_shrink", 2, [2, 3]), ("post_shrink", 2, [2, 3])]
    wait_for(lambda: len(fake.messages()) == 2)
    assert fake.messages() == ["Evolving;Release;n2", "Evolving;Release;n3"]


def test_bad_releases_are_refused_and_change_nothing(fake_scheduler):
    fake = fake_scheduler(lambda m, f: None)

    def main():
        apgas.define_malleable_handler(Handler())
        with pytest.raises(ValueError, match="place 0 runs main"):
            apgas.release_places([apgas.place(0)])
        with pytest.raises(DeadPlaceError, match="place 7 .*not a live place"):
            apgas.release_places([7])
        with pytest.raises(ValueError, match="names a place twice"):
            apgas.release_places([1, 1])
        with pytest.raises(ValueError, match="non-empty list"):
            apgas.release_places(apgas.place(1))
        apgas.release_places([1])
        with pytest.raises(DeadPlaceError, match="place 1 "):  # gone now
            apgas.release_places([1])
        return [p.id for p in apgas.places()]

    assert apgas.run(main, places=3) == [0, 2]
    wait_for(lambda: len(fake.messages()) == 1)


def test_release_with_a_handler_that_cannot_take_the_chosen_places(fake_scheduler):
    fake_scheduler(lambda m, f: None)

    def main():
        apgas.define_malleable_handler(OrdersOnly())
        with pytest.raises(ApgasError, match=r"pre_shrink\(self, n, chosen=None\)"):
            apgas.release_places([1])
        return len(apgas.places())

    assert apgas.run(main, places=2) == 2


# -- check_status ------------------------------------------------------------------------

def test_check_status_expands_and_shrinks_through_the_handler(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")
    answers = iter(["expand 3", "shrink 1", "none"])

    def script(message, fake):
        if not message.startswith("Evolving;Check"):
            return None
        answer = next(answers)
        if answer == "expand 3":
            fake.later("grow 2 nodeA nodeB")
        elif answer == "shrink 1":
            fake.later("shrink 2")
        return answer

    fake = fake_scheduler(script)

    def main():
        handler = Handler()
        apgas.define_malleable_handler(handler)
        sizes = [apgas.check_status(1, 4, preferred=2, factor=1),
                 apgas.check_status(1, 4), apgas.check_status(1, 4)]
        return sizes, handler.calls

    sizes, calls = apgas.run(main, places=1)
    assert sizes == [3, 1, 1]
    assert calls == [("post_grow", 2, [1, 2]), ("pre_shrink", 2, None), ("post_shrink", 2, [1, 2])]
    assert fake.messages() == ["Evolving;Check;1;4;2;1", "Evolving;Check;1;4;0;1",
                               "Evolving;Check;1;4;0;1"]


def test_check_status_inhibition_period(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0.5")
    fake = fake_scheduler(lambda m, f: "none" if m.startswith("Evolving;Check") else None)

    def main():
        apgas.define_malleable_handler(Handler())
        for _ in range(5):
            assert apgas.check_status(1, 2) == 1  # the first asks; the others are no-ops
        time.sleep(0.6)
        return apgas.check_status(1, 2)

    assert apgas.run(main, places=1) == 1
    assert fake.messages() == ["Evolving;Check;1;2;0;1"] * 2


def test_check_status_refusals_and_bad_answers(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")
    answers = iter(["error policy easy does not grant evolving requests", "resize 9", "expand x"])
    fake_scheduler(lambda m, f: next(answers) if m.startswith("Evolving;Check") else None)

    def main():
        apgas.define_malleable_handler(Handler())
        with pytest.raises(ApgasError, match="refused check_status.*policy easy"):
            apgas.check_status(1, 2)
        for _ in range(2):
            with pytest.raises(ApgasError, match="expected 'expand <k>'"):
                apgas.check_status(1, 2)
        return len(apgas.places())

    assert apgas.run(main, places=2) == 2


@pytest.mark.parametrize("args, match", [
    ((0, 2), "min must be an integer >= 1, got 0"),
    ((3, 2), "min 3 is above max 2"),
    ((1, 2, 5), "preferred must be None or between min 1 and max 2, got 5"),
    ((1, 2, None, 0), "factor must be an integer >= 1, got 0"),
    ((1.5, 2), "min must be an integer"),
])
def test_check_status_bad_arguments(fake_scheduler, args, match):
    fake_scheduler(lambda m, f: "none")

    def main():
        apgas.define_malleable_handler(Handler())
        with pytest.raises(ValueError, match=match):
            apgas.check_status(*args)
        with pytest.raises(ValueError, match="positive number of places, got 0"):
            apgas.request_grow(0)

    apgas.run(main, places=1)


# -- no scheduler, no handler, a scheduler that vanishes ------------------------------------

def test_evolving_calls_need_a_handler_and_a_scheduler(monkeypatch, malleable_address):
    monkeypatch.delenv("APGAS_SCHEDULER", raising=False)

    def main():
        for call in (lambda: apgas.request_grow(1), lambda: apgas.release_places([1]),
                     lambda: apgas.check_status(1, 2)):
            with pytest.raises(ApgasError, match="register a MalleableHandler first"):
                call()
        apgas.define_malleable_handler(Handler())
        for call in (lambda: apgas.request_grow(1), lambda: apgas.release_places([1]),
                     lambda: apgas.check_status(1, 2)):
            with pytest.raises(ApgasError, match="no scheduler is attached"):
                call()
        with pytest.raises(ApgasError, match="steered from place 0"):
            apgas.at(apgas.place(1), apgas.request_grow, 1)
        return len(apgas.places())

    assert apgas.run(main, places=2) == 2


def test_a_scheduler_that_vanishes(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")
    fake = fake_scheduler(lambda m, f: None)

    def main():
        apgas.define_malleable_handler(Handler())
        ready(fake)
        fake.close()
        request = apgas.request_grow(1)
        with pytest.raises(GrowRefused, match="did not answer"):
            request.result(timeout=20)
        with pytest.raises(ApgasError, match="did not answer 'Evolving;Check"):
            apgas.check_status(1, 3)
        return apgas.at(apgas.place(1), lambda: apgas.here().id)

    assert apgas.run(main, places=2) == 1


def test_a_scheduler_that_closes_without_answering(fake_scheduler, monkeypatch):
    """It reads the line and hangs up: the request is refused, the check raises,
    both name the scheduler, and the program goes on."""
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")
    fake = fake_scheduler(lambda m, f: None)
    where = "{}:{}".format(*fake.address)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(2)
        with pytest.raises(GrowRefused, match="closed the connection without answering "
                                              "'Evolving;Request;2"):
            request.result(timeout=20)
        assert request.state == "refused" and where in request.reason
        with pytest.raises(ApgasError, match=f"scheduler at {where} closed the connection without "
                                             "answering 'Evolving;Check;1;3;0;1.*keeps its 2"):
            apgas.check_status(1, 3)
        seen = []
        with apgas.finish():
            apgas.async_at(apgas.place(1), seen.append, 1)  # the program goes on
        return apgas.at(apgas.place(1), lambda: apgas.here().id), len(apgas.places())

    assert apgas.run(main, places=2) == (1, 2)
    assert fake.messages() == ["Evolving;Request;2", "Evolving;Check;1;3;0;1"]


def test_a_scheduler_that_does_not_answer_in_time(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")
    monkeypatch.setattr("apgas.malleable.SocketMalleableCommunicator.ANSWER_TIMEOUT", 0.3)
    fake = fake_scheduler(lambda m, f: f.SILENT if m.startswith("Evolving") else None)
    fake.silence = 0.6
    where = "{}:{}".format(*fake.address)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(1)
        assert request.wait(20) and request.state == "refused"
        assert f"scheduler at {where} did not answer 'Evolving;Request;1" in request.reason
        with pytest.raises(ApgasError, match=f"scheduler at {where} did not answer 'Evolving;Check"):
            apgas.check_status(1, 3)
        return apgas.at(apgas.place(1), lambda: "still here")

    assert apgas.run(main, places=2) == "still here"


def test_a_communicator_that_answers_nothing_refuses_too(fake_scheduler, monkeypatch):
    """A communicator of another kind whose future gets "" (no answer)."""
    import concurrent.futures

    from apgas.malleable import SocketMalleableCommunicator

    def ask(self, message):
        answer = concurrent.futures.Future()
        answer.set_result("")
        return answer

    monkeypatch.setattr(SocketMalleableCommunicator, "ask", ask)
    fake_scheduler(lambda m, f: None)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(1)
        assert request.state == "refused" and "gave no answer to Evolving;Request;1" in request.reason
        with pytest.raises(ApgasError, match="gave no answer to 'Evolving;Check"):
            apgas.check_status(1, 3)
        return len(apgas.places())

    assert apgas.run(main, places=1) == 1


def test_a_queued_request_whose_scheduler_dies_times_out_and_stays_pending(fake_scheduler):
    fake = fake_scheduler(lambda m, f: "ok 1" if m.startswith("Evolving;Request") else None)

    def main():
        apgas.define_malleable_handler(Handler())
        request = apgas.request_grow(1)
        wait_for(lambda: fake.messages() == ["Evolving;Request;1"])
        fake.close()  # after its "ok"
        assert not request.wait(0.3)
        with pytest.raises(TimeoutError, match="still pending after 0.3 s.*stays outstanding"):
            request.result(timeout=0.3)
        state = request.state
        apgas.disable_malleable_handler()  # ends it
        return state, request.state, apgas.at(apgas.place(1), lambda: apgas.here().id)

    assert apgas.run(main, places=2) == ("pending", "refused", 1)


def test_concurrent_checks_ask_once_within_the_inhibition_period(fake_scheduler, monkeypatch):
    import threading

    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "60")
    fake = fake_scheduler(lambda m, f: "none" if m.startswith("Evolving;Check") else None)

    def main():
        apgas.define_malleable_handler(Handler())
        start = threading.Barrier(8)
        sizes = []

        def check():
            start.wait()
            sizes.append(apgas.check_status(1, 2))

        threads = [threading.Thread(target=check) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        return sizes

    assert apgas.run(main, places=1) == [1] * 8
    assert fake.messages() == ["Evolving;Check;1;2;0;1"]


def test_an_answer_whose_order_never_comes(fake_scheduler, monkeypatch):
    monkeypatch.setattr("apgas._malleability.orders.ORDER_WAIT", 0.5)
    monkeypatch.setenv("APGAS_JOIN_TIMEOUT", "0.5")
    fake_scheduler(lambda m, f: "expand 4" if m.startswith("Evolving;Check") else None)

    def main():  # one place: nothing must join within the short timeout at the start
        apgas.define_malleable_handler(Handler())
        with pytest.raises(ApgasError, match="no order came within 1 s; the program keeps its 1"):
            apgas.check_status(1, 4)
        return len(apgas.places())

    assert apgas.run(main, places=1) == 1


def test_a_failed_order_ends_the_wait_of_check_status(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")

    def script(message, fake):
        if message.startswith("Evolving;Check"):
            fake.later("grow 1 no-such-host.invalid")
            return "expand 2"
        return None

    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "localhost")  # the launcher refuses unknown hosts
    fake = fake_scheduler(script)

    def main():
        apgas.define_malleable_handler(Handler())
        return apgas.check_status(1, 2)

    assert apgas.run(main, places=1) == 1
    fake.join()
    assert fake.replies[0][0].startswith("error no place was added")
