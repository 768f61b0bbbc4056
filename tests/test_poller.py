"""innet.io.poller: a node's wait for its sockets or its next deadline, in whole milliseconds only where they are
many, in microseconds for the last of them."""

import os
import select
import time

import pytest

import innet.io.poller as poller_module
from innet.io.poller import Poller


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


class Spy:
    """select.poll's object, recording every timeout it is given."""

    def __init__(self, real):
        self.real, self.timeouts = real, []

    def poll(self, timeout):
        self.timeouts.append(timeout)
        return self.real.poll(timeout)

    def register(self, fd, events):
        self.real.register(fd, events)


def test_a_ready_descriptor_ends_the_wait_and_is_named(pipe):
    r, w = pipe
    p = Poller()
    p.register(r)
    os.write(w, b"x")
    assert p.wait(None) == [r] and p.wait(time.monotonic() + 5) == [r]
    os.read(r, 1)
    p.unregister(r)
    assert p.wait(time.monotonic() - 1) == []


def test_a_far_deadline_is_polled_for_in_whole_milliseconds_ending_early_a_near_one_selected_in_microseconds(
        pipe, monkeypatch):
    r, _ = pipe
    p = Poller()
    spy = Spy(p._poll)
    p._poll = spy
    p.register(r)
    selected = []
    real_select = select.select
    monkeypatch.setattr(poller_module.select, "select",
                        lambda rd, wr, ex, timeout: selected.append(timeout) or real_select(rd, wr, ex, timeout))
    monkeypatch.setattr(poller_module, "time", type("Clock", (), {"monotonic": staticmethod(lambda: 100.0)}))
    assert p.wait(100.0107, None) == [] and spy.timeouts == [9]  # a millisecond early: the loop waits again
    assert p.wait(None, 100.0015) == [] and selected == [pytest.approx(0.0015)]  # the rest in microseconds
    assert p.wait(99.0) == [] and spy.timeouts[-1] == 0  # a deadline passed: a look, no wait
    assert p.wait(None) == [] and spy.timeouts[-1] == poller_module.LONGEST_MS  # no deadline: a look round a second
