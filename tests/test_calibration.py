"""The calibration behind --dilation auto: its search, and its cache (written once, re-used, measured
again when the data plane changes). The measurement itself is Mininet's: tests/test_dilation_mininet.py."""

import dataclasses
import json
import statistics

import numpy as np
import pytest

from innet.backends.mininet import calibration as calibration_module
from innet.backends.mininet.calibration import TOLERANCE, calibration, data_plane_version, faithful_rate, machine_key, search, settled


def ratios(table):
    calls = []

    def ratio_at(rate):
        calls.append(rate)
        return table[rate]

    return ratio_at, calls


@pytest.mark.parametrize("kind", [float, np.float64])  # a run's completion time is numpy's: so is its ratio
def test_the_search_keeps_the_highest_rate_before_the_first_that_misses(kind, monkeypatch):
    monkeypatch.setattr(calibration_module, "REFINE", 0)  # the doubling alone
    ratio_at, calls = ratios({1.0: kind(1.01), 2.0: kind(TOLERANCE), 4.0: kind(1.3), 8.0: kind(1.0)})
    assert search(ratio_at, (1.0, 2.0, 4.0, 8.0)) == (2.0, {"1": 1.01, "2": TOLERANCE, "4": 1.3})
    assert calls == [1.0, 2.0, 4.0]  # a miss ends it: 8 is not tried
    ratio_at, _ = ratios({1.0: kind(TOLERANCE + 0.01), 2.0: kind(1.0)})
    assert search(ratio_at, (1.0, 2.0))[0] == 1.0  # none faithful: the lowest, the best there is
    ratio_at, _ = ratios({1.0: kind(1.0), 2.0: kind(0.99), 4.0: kind(1 / TOLERANCE - 0.01), 8.0: kind(1.0)})
    assert search(ratio_at, (1.0, 2.0, 4.0, 8.0))[0] == 2.0  # faster than its links: not faithful either


@pytest.mark.parametrize(("line", "faithful", "tried"), [
    (3.0, 2.83, [1, 2, 4, 2.83, 3.36]),  # the first midpoint within, the second not
    (2.5, 2.38, [1, 2, 4, 2.83, 2.38]),  # the first not, the second within
    (2.1, 2.0, [1, 2, 4, 2.83, 2.38]),  # neither: the doubling's rate stands
    (3.9, 3.36, [1, 2, 4, 2.83, 3.36]),
    (0.5, 1.0, [1]),  # the lowest rate misses: nothing below it is tried
    (100.0, 8.0, [1, 2, 4, 8]),  # none misses: nothing above the grid is guessed
])
def test_the_search_halves_the_step_between_the_last_faithful_rate_and_the_miss(line, faithful, tried):
    calls = []

    def ratio_at(rate):  # within the band up to ``line``, above it past it
        calls.append(rate)
        return np.float64(1 + 0.02 * rate / line)

    rate, measured = search(ratio_at, (1.0, 2.0, 4.0, 8.0))
    assert rate == faithful and calls == tried
    assert list(measured) == [f"{r:g}" for r in tried] and calibration_module.faithful_of(measured) == faithful


def test_the_faithful_rate_is_read_back_from_the_ratios():
    faithful_of = calibration_module.faithful_of
    assert faithful_of({"5": 1.01, "10": 1.03, "7.07": 1.015, "8.41": 1.025}) == 7.07
    assert faithful_of({"5": 1.03}) == 5.0 and faithful_of({"5": 1.0, "10": 1.01}) == 10.0
    assert faithful_of({"5": 1.0, "10": 0.9, "20": 1.0}) == 5.0  # faster than its links misses too


@pytest.mark.parametrize(("ratios", "done"), [
    ([1.0], False),  # one run of three: the median could be anywhere
    ([1.0, 1.01], True),  # two within: so is the median, whatever the third
    ([1.0, TOLERANCE + 0.01], False),  # one within, one above: the third decides
    ([TOLERANCE + 0.01, float("inf")], True),  # two above (a failed run counts as above)
    ([1 / TOLERANCE - 0.01, TOLERANCE + 0.01], False),  # one below, one above: the median may be within
    ([0.9, 0.95], True),  # two below
    ([1.0, 1.3, 0.9], True),  # all three made
])
def test_the_calibrations_runs_stop_once_the_median_s_side_is_known(ratios, done):
    assert settled(ratios) is done and settled([np.float64(r) for r in ratios]) is done
    if done and len(ratios) < 3:  # whatever a third run gives, the median is on the side the two agree on
        side = [not 1 / TOLERANCE <= r <= TOLERANCE for r in ratios][0]
        for third in (0.5, 1.0, 1.5):
            assert (not 1 / TOLERANCE <= statistics.median([*ratios, third]) <= TOLERANCE) == side


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INNET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration_module, "RATES", (5.0, 10.0, 20.0))
    monkeypatch.setattr(calibration_module, "REFINE", 0)  # the cache's tests: the doubling's rates alone
    monkeypatch.setattr(calibration_module, "measured_hop", lambda rate, data_plane="python": 0.0025)  # Mininet's (test_dilation_mininet)
    return tmp_path / "calibration.json"


def test_the_cache_is_written_once_and_reused(cache):
    ratio_at, calls = ratios({5.0: 1.0, 10.0: 1.02, 20.0: 1.4})
    assert faithful_rate(ratio_at, version="v1") == 10.0
    [saved] = json.loads(cache.read_text())["calibrations"]
    assert saved["key"] == dataclasses.asdict(machine_key("v1")) and saved["faithful_mbps"] == 10.0
    assert saved["ratios"] == {"5": 1.0, "10": 1.02, "20": 1.4}
    assert faithful_rate(ratio_at, version="v1") == 10.0
    assert calls == [5.0, 10.0, 20.0]  # the second run measured nothing


def test_the_hop_latency_is_measured_at_the_faithful_rate_and_cached_with_it(cache):
    ratio_at, _ = ratios({5.0: 1.0, 10.0: 1.02, 20.0: 1.4})
    hops = []

    def hop_at(rate):
        hops.append(rate)
        return 0.0031234567

    assert calibration(ratio_at, version="v1", hop_at=hop_at).hop_s == 0.003123
    assert json.loads(cache.read_text())["calibrations"][0]["hop_s"] == 0.003123
    assert calibration(ratio_at, version="v1", hop_at=hop_at).hop_s == 0.003123 and hops == [10.0]


def test_a_calibration_without_a_hop_latency_is_measured_again(cache):
    """A version-2 cache (before the hop latency) is not read as one: the next run measures both."""
    ratio_at, calls = ratios({5.0: 1.0, 10.0: 1.0, 20.0: 1.0})
    faithful_rate(ratio_at, version="v1")
    old = json.loads(cache.read_text())
    del old["calibrations"][0]["hop_s"]
    cache.write_text(json.dumps(old))
    assert calibration(ratio_at, version="v1").hop_s == 0.0025 and len(calls) == 6


def test_a_new_data_plane_or_a_request_measures_again(cache):
    ratio_at, calls = ratios({5.0: 1.0, 10.0: 1.02, 20.0: 1.4})
    faithful_rate(ratio_at, version="v1")
    slower, _ = ratios({5.0: 1.0, 10.0: 1.3, 20.0: 1.4})
    assert faithful_rate(slower, version="v2") == 5.0
    assert [c["key"]["data_plane"] for c in json.loads(cache.read_text())["calibrations"]] == ["v1", "v2"]
    assert faithful_rate(ratio_at, version="v2", again=True) == 10.0
    assert len(calls) == 6


def test_each_data_plane_keeps_its_calibration_and_the_file_the_newest(cache, monkeypatch):
    """Two checkouts on one machine (main and a branch) each keep theirs: neither measures again when the other ran
    (they did, one key in the file, and a busy machine then measured a lower rate each time); the oldest go."""
    monkeypatch.setattr(calibration_module, "KEPT", 3)
    ratio_at, calls = ratios({5.0: 1.0, 10.0: 1.02, 20.0: 1.4})
    assert faithful_rate(ratio_at, version="v1") == 10.0 and len(calls) == 3
    slower, _ = ratios({5.0: 1.0, 10.0: 1.3, 20.0: 1.4})
    assert faithful_rate(slower, version="v2") == 5.0
    assert faithful_rate(ratio_at, version="v1") == 10.0 and len(calls) == 3  # kept: nothing measured again
    for version in ("v3", "v4"):
        faithful_rate(ratio_at, version=version)
    assert [c["key"]["data_plane"] for c in json.loads(cache.read_text())["calibrations"]] == ["v2", "v3", "v4"]


def test_each_data_plane_is_calibrated_apart(cache):
    """The eBPF switch's calibration has its own file and key: measuring it leaves the Python switch's alone."""
    python_at, python_calls = ratios({5.0: 1.0, 10.0: 1.02, 20.0: 1.4})
    ebpf_at, ebpf_calls = ratios({5.0: 1.0, 10.0: 1.0, 20.0: 1.01})
    assert faithful_rate(python_at) == 10.0
    assert faithful_rate(ebpf_at, data_plane="ebpf") == 20.0
    assert faithful_rate(python_at) == 10.0 and faithful_rate(ebpf_at, data_plane="ebpf") == 20.0
    assert python_calls == [5.0, 10.0, 20.0] and ebpf_calls == [5.0, 10.0, 20.0]  # each measured once
    assert json.loads(cache.read_text())["calibrations"][0]["faithful_mbps"] == 10.0
    [saved] = json.loads((cache.parent / "calibration-ebpf.json").read_text())["calibrations"]
    assert saved["faithful_mbps"] == 20.0 and saved["key"]["data_plane"] == data_plane_version("ebpf")
    assert data_plane_version("ebpf") != data_plane_version()


def test_a_run_takes_the_calibration_of_the_switches_it_will_run():
    from innet.backends.mininet.dataplane import calibrated_plane
    from innet.planning.spec import RunSpec
    from innet.wire.faults import FaultSpec
    from topologies import build

    star, leaf_spine = build("star", workers=4), build("leaf-spine", racks=2, hosts_per_rack=2)
    assert calibrated_plane(star, RunSpec(data_plane="python")) == "python"
    assert calibrated_plane(star, RunSpec(data_plane="ebpf")) == "ebpf"
    assert calibrated_plane(star, RunSpec(data_plane="ebpf", mode="pbox")) == "ebpf"  # its switch forwards in the kernel
    assert calibrated_plane(star, RunSpec(data_plane="ebpf", collective="all_gather")) == "ebpf"  # all six collectives
    assert calibrated_plane(star, RunSpec(data_plane="ebpf", program="max_allreduce")) == "python"  # the Python switch
    assert calibrated_plane(star, RunSpec(data_plane="ebpf", faults=FaultSpec(loss=0.01))) == "python"
    # links between switches: the hosts at the paths' ends hold them where every switch hears its children alike
    assert calibrated_plane(leaf_spine, RunSpec(data_plane="ebpf")) == "ebpf"
    leaf_spine.edges["s1", "t2"]["latency"] *= 2
    assert calibrated_plane(leaf_spine, RunSpec(data_plane="ebpf")) == "python"


def test_the_data_plane_version_follows_its_code(tmp_path, monkeypatch):
    (tmp_path / "switch.py").write_text("x = 1\n")
    monkeypatch.setattr(calibration_module, "ROOT", str(tmp_path))
    monkeypatch.setattr(calibration_module, "DATA_PLANE", ("switch.py",))
    first = data_plane_version()
    assert data_plane_version() == first
    (tmp_path / "switch.py").write_text("x = 2\n")
    assert data_plane_version() != first


def test_an_unwritable_cache_is_one_clear_error(tmp_path, monkeypatch):
    from innet.errors import UserError

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("INNET_CACHE_DIR", str(tmp_path / "file" / "sub"))
    with pytest.raises(UserError, match="cannot write the dilation calibration .* set INNET_CACHE_DIR"):
        faithful_rate(lambda rate: 1.0, version="v1", hop_at=lambda rate: 0.0)


def test_is_cached_says_whether_a_run_would_measure_first(cache):
    from innet.backends.mininet.calibration import is_cached

    assert not is_cached() and not is_cached("ebpf")
    faithful_rate(lambda rate: 1.0, rates=(10.0,), hop_at=lambda rate: 0.001)
    assert is_cached() and not is_cached("ebpf")
