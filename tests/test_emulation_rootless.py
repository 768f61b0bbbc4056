"""innet.backends.mininet.emulation's parts that need no network, so no root: interrupts wait until what a run creates is
recorded (the deferred blocks). The fidelity verdict that replaced the CPU-bound warnings: tests/test_fidelity.py."""

import os
import signal
import threading
import time

import pytest

from innet.backends.mininet.network import signals_as_interrupts, signals_deferred


@pytest.fixture
def another_thread():
    """A second thread that does not block signals, as numpy's BLAS thread in every innet run: the kernel
    may hand it a process's SIGINT, and Python then runs the handler in the main thread."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_lands_only_after_the_deferred_block(another_thread, sig):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    for _ in range(10):
        steps = []
        with pytest.raises(KeyboardInterrupt):
            with signals_as_interrupts():
                with signals_deferred():
                    os.kill(os.getpid(), sig)
                    time.sleep(0.01)  # the handler has every chance to run here
                    steps.append("recorded")
                steps.append("went on")
        assert steps == ["recorded"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_block_without_a_signal_is_not_interrupted_and_restores_the_handlers(another_thread):
    sigint = signal.getsignal(signal.SIGINT)
    with signals_as_interrupts():
        term = signal.getsignal(signal.SIGTERM)
        with signals_deferred():
            assert signal.getsignal(signal.SIGTERM) is not term
        assert signal.getsignal(signal.SIGTERM) is term
    assert signal.getsignal(signal.SIGINT) is sigint


def test_a_runs_directory_is_private_unpredictable_and_recorded_then_removed(monkeypatch, tmp_path):
    """tempfile.mkdtemp: mode 0700 under a random name no other user can take first; the run's state file
    (named after it) records it, so --clean finds what a killed run left; both go when the run ends."""
    import json

    import networkx as nx

    from innet.backends.mininet import cleanup, network

    monkeypatch.setattr(cleanup, "STATE_DIR", str(tmp_path))

    class Bare(network.Network):  # nothing built, nothing to tear down: only the directory and the record
        def build(self) -> None:
            pass

        def teardown(self) -> None:
            pass

    with network.built(nx.Graph(), 1500, Bare) as one, network.built(nx.Graph(), 1500, Bare) as two:
        assert one.run_dir != two.run_dir and os.path.basename(one.run_dir).startswith("innet-")
        assert os.stat(one.run_dir).st_mode & 0o777 == 0o700
        with open(one.state.path) as fh:
            assert json.load(fh)["dir"] == one.run_dir
        assert [data.dir for _, data, live in cleanup.records() if live] == sorted([one.run_dir, two.run_dir],
                                                                                  key=lambda d: os.path.basename(d))
    assert not any(os.path.exists(p) for p in (one.run_dir, two.run_dir, one.state.path, two.state.path))
