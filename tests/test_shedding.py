"""The switch's overload control: when it cuts the admitted share of chunks, when it gives it back, and the
filter it installs (the filter itself runs in the kernel in tests/test_rawport.py)."""

from innet.backends.shedding import HIGH, INTERVAL, LEVELS, LOW, Shedder, admitted, chunk_filter


class FakePort:
    def __init__(self) -> None:
        self.dropped = 0
        self.queued = 0
        self.filter: int | None = None  # the threshold installed

    def drops(self) -> int:
        return self.dropped

    def backlog(self) -> int:
        return self.queued

    def attach_filter(self, program) -> None:
        self.filter = program[11][3]  # the jge's constant: the threshold

    def detach_filter(self) -> None:
        self.filter = None


def ticks(shedder: Shedder, start: float, n: int) -> float:
    for k in range(n):
        shedder.tick(start + k * INTERVAL)
    return start + n * INTERVAL


def test_short_queues_and_no_drops_admit_everything_and_attach_no_filter():
    ports = [FakePort(), FakePort()]
    shedder = Shedder(ports)
    ticks(shedder, 1.0, 50)
    assert shedder.admit == 1.0 and all(p.filter is None for p in ports)
    assert shedder.report() == {"shedding_s": 0.0, "lowest_admit": 1.0, "admit": 1.0}


def test_drops_cut_the_admitted_share_on_every_port_alike_and_short_queues_give_it_back():
    ports = [FakePort(), FakePort()]
    shedder = Shedder(ports)
    now = ticks(shedder, 1.0, 1)
    ports[1].dropped = 500  # the kernel dropped frames at one port
    now = ticks(shedder, now, 1)
    assert shedder.admit == 0.8
    assert ports[0].filter == ports[1].filter == round(0.8 * LEVELS)
    ports[1].queued = HIGH + 1  # still queueing, and more each time
    for k in range(3):
        ports[1].queued += 1000
        now = ticks(shedder, now, 1)
    assert abs(shedder.admit - 0.8 * 0.93 ** 3) < 1e-9
    ports[1].queued = (HIGH + LOW) // 2  # between the marks: hold
    now = ticks(shedder, now, 5)
    assert abs(shedder.admit - 0.8 * 0.93 ** 3) < 1e-9
    ports[1].queued = LOW - 1  # drained: admit more, a step per interval, up to everything
    now = ticks(shedder, now, 200)
    assert shedder.admit == 1.0 and all(p.filter is None for p in ports)
    report = shedder.report()
    assert report["lowest_admit"] == round(0.8 * 0.93 ** 3, 4) and report["shedding_s"] > 0


def test_an_idle_switch_admits_everything_again():
    ports = [FakePort()]
    shedder = Shedder(ports)
    ports[0].dropped = 10
    ticks(shedder, 1.0, 2)
    assert shedder.admit < 1 and ports[0].filter is not None
    shedder.tick(5.0)  # nothing woke the switch for seconds
    assert shedder.admit == 1.0 and ports[0].filter is None


def test_admitted_chunks_are_spread_evenly_and_grow_with_the_threshold():
    for threshold in (16, 64, 128, 200):
        share = len(admitted(range(100_000), threshold)) / 100_000
        assert abs(share - threshold / LEVELS) < 0.01
    assert set(admitted(range(5000), 64)) <= set(admitted(range(5000), 128))
    assert chunk_filter(LEVELS - 1)[11][3] == LEVELS - 1
