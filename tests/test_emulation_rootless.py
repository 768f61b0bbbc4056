"""innet.backends.mininet's parts that need no network, so no root: interrupts wait until what a run creates is
recorded (the deferred blocks), and the warnings that CPUs, not links, set a run's pace."""

import os
import signal
import threading
import time

import pytest

from innet.backends.mininet import CPU_BOUND, _signals_as_interrupts, _signals_deferred, bottlenecks


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
            with _signals_as_interrupts():
                with _signals_deferred():
                    os.kill(os.getpid(), sig)
                    time.sleep(0.01)  # the handler has every chance to run here
                    steps.append("recorded")
                steps.append("went on")
        assert steps == ["recorded"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_block_without_a_signal_is_not_interrupted_and_restores_the_handlers(another_thread):
    sigint = signal.getsignal(signal.SIGINT)
    with _signals_as_interrupts():
        term = signal.getsignal(signal.SIGTERM)
        with _signals_deferred():
            assert signal.getsignal(signal.SIGTERM) is not term
        assert signal.getsignal(signal.SIGTERM) is term
    assert signal.getsignal(signal.SIGINT) is sigint


def test_bottleneck_warnings_name_the_cpu_bound_switch_and_socket_drops():
    stats = {"t1": {"cpu_share": 0.95, "socket_drops": {"t1-eth0": 0}},
             "s1": {"cpu_share": 0.1, "socket_drops": {"s1-eth1": 12}}}
    warnings = bottlenecks(stats, host_cpu_s=0.0, wall=1.0)
    assert any(w.startswith("switch t1 was CPU-bound (95% of a core") for w in warnings)
    assert any(w.startswith("switch s1 dropped frames at its sockets (s1-eth1: 12)") for w in warnings)
    assert not any("s1 was CPU-bound" in w for w in warnings)
    assert bottlenecks({"s1": {"cpu_share": 0.1}}, host_cpu_s=0.1, wall=1.0) == []


def test_a_machine_the_kernel_saturates_is_named_although_the_processes_are_not():
    """The PBox's one shaped link: its processes take one core, the kernel's veth and shaper work the rest."""
    cores = os.cpu_count()
    quiet = {"s1": {"cpu_share": 0.1}}
    assert bottlenecks(quiet, host_cpu_s=0.0, wall=1.0, machine_busy=0.95 * CPU_BOUND * cores) == []
    [warning] = bottlenecks(quiet, host_cpu_s=0.0, wall=1.0, machine_busy=CPU_BOUND * cores)
    assert warning == (f"the machine kept {CPU_BOUND * cores:.1f} of its {cores} cores busy (0.1 of them in switch and "
                       "host processes): the emulation was CPU-bound, not link-bound")
