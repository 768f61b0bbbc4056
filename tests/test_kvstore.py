"""The parameter-server model behind ``--ps`` (innet.planning.timing.kvstore): MXNet's KVStore and P3 over the same
servers, by hand on tiny schedules, and on a run: its figure beside an exact emulated run."""

import pytest

from innet.backends.local.run import LocalRun
from innet.cli import main
from innet.hosts.training import PS_SCHEMES, Training
from innet.planning.prediction import frame_bytes
from innet.planning.spec import RunSpec
from innet.planning.timing import predict
from innet.planning.timing.kvstore import SCHEMES, Key, keys_of, period, serve
from topologies import build

E = 100  # elements a key; at ``RATE`` one worker's copy of it takes 1 s on a link
RATE = float(frame_bytes(E))


def test_the_schemes_are_the_options():
    assert tuple(SCHEMES) == PS_SCHEMES


def test_a_link_takes_the_arrived_job_of_least_rank_and_never_preempts():
    jobs = [(0.0, (1.0, 0), 2.0), (0.5, (1.0, 1), 1.0), (1.0, (0.0, 2), 1.0)]
    assert serve(jobs) == [2.0, 4.0, 3.0]  # job 2 overtakes job 1 once job 0 is done, not before
    fifo = [(t, (0.0, j), s) for j, (t, _, s) in enumerate(jobs)]
    assert serve(fifo) == [2.0, 3.0, 4.0]
    assert serve([(5.0, (0.0, 0), 1.0)]) == [6.0]  # an idle link waits for the first arrival


def test_kvstore_by_hand_push_then_pull_on_each_keys_server():
    """Two layers, two machines: layer 1's key (ready at 2 s) on server 0, layer 0's (ready at 3 s) on server 1;
    each pushes for 1 s (one remote copy), then pulls for 1 s. Pulls end at 4 and 5; the next forward pass
    runs layer 0 at max(3, 5) .. 5.5, layer 1 at 5.5 .. 6, so the next iteration starts 5 s after this one."""
    t = Training(1.0, (1.0, 1.0), layer=(1, 0), forward_layers=(0.5, 0.5))
    assert period(t, [E, E], 2, RATE, E, "kvstore") == 5.0
    assert period(t, [E, E], 2, RATE, E, "kvstore", request=0.25) == 5.5  # layer 0 pulled at 5.5: two requests later
    assert period(t, [E, E], 1, RATE, E, "kvstore") == pytest.approx(3.0)  # one machine: nothing leaves it


def test_a_big_key_is_split_over_every_server_as_mxnet_does_and_whole_loads_one():
    """One layer of 4 keys' worth on 4 machines: the KVStore splits it (over the bound) into 4 parts, each
    pushed by 3 remote workers and pulled back in parallel (3 s + 3 s); ``whole`` keeps it on one server:
    12 s + 12 s."""
    t = Training(0.0, (0.0,), layer=(0,), forward_layers=(0.0,))
    assert period(t, [4 * E], 4, RATE, E, "kvstore", bound=E) == 6.0
    assert period(t, [4 * E], 4, RATE, E, "whole", bound=E) == 24.0
    assert period(t, [4 * E], 4, RATE, E, "kvstore", bound=4 * E) == 24.0  # not over the bound: one server
    assert [k.elements for k in keys_of(t, [10], False, split=5, servers=4)] == [3, 3, 2, 2]


def test_slices_are_keys_of_their_own_and_whole_keys_merge_a_layers_slices():
    t = Training(1.0, (2.0, 0.0, 1.0), layer=(1, 1, 0), forward_layers=(0.5, 0.5))
    assert keys_of(t, [E, E, E], True) == [Key(1, E, 3.0), Key(1, E, 3.0), Key(0, E, 4.0)]
    assert keys_of(t, [E, E, E], False) == [Key(1, 2 * E, 3.0), Key(0, E, 4.0)]


def test_p3_order_and_slices_beat_the_kvstore_where_a_big_layer_comes_first():
    """Layer 1 (6 keys' worth, first out of the backward pass, ready at 3 s) and layer 0 (1 key, at 4 s) on 2
    machines. The KVStore pushes layer 1 whole to server 0 (3..9 s) and pulls it (9..15): the next forward
    pass runs layer 1 at 15..16, so the next iteration starts 14 s on. Sliced, the 7 slices go round-robin
    and both layers are back by 8 s (FIFO: layer 0 last, on server 0: 7..8) - 8 s; P3 also takes layer 0's
    slice first at 4 s (pulled by 6), so layer 0's forward runs at 6..7 and layer 1's at 8..9 - 7 s. Priority
    over whole keys changes nothing here: each layer has a server to itself."""
    t = Training(2.0, (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0), layer=(1, 1, 1, 1, 1, 1, 0), forward_layers=(1.0, 1.0))
    assert {s: period(t, [E] * 7, 2, RATE, E, s) for s in SCHEMES} == {
        "kvstore": 14.0, "whole": 14.0, "priority": 14.0, "sliced": 8.0, "p3": 7.0}


def test_a_run_with_ps_is_exact_and_carries_the_models_figure():
    """ResNet-50 at a thousandth on a star of 4 at 30 Mbit/s: the emulated run (innet's own exchange) is exact;
    its prediction carries the parameter servers' figure, the model's ``period`` at the host links' rate, each
    request a header frame's round trip between two hosts (4 hops of serialization and latency)."""
    graph = build("star", workers=4, bw=30.0)
    for ps in ("kvstore", "p3"):
        run = RunSpec(workload="resnet50", workload_scale=0.001, compute_scale=250, iterations=2, predict=True, ps=ps,
                      priority="p3" if ps == "p3" else "fifo", slice_elements=500 if ps == "p3" else 0)
        lr = LocalRun(graph, run)
        result = lr.finish()
        assert result["correct"], result["errors"]
        figures = predict(graph, run, list(lr.rp.plans), lr.rp.per_packet, 0.0)
        training = run.training()
        rate = 30e6 / 8
        request = 4 * (frame_bytes(0) / rate + graph.edges["h1", "s1"]["latency"])
        assert figures["ps_iteration_s"] == pytest.approx(period(
            training, run.call_sizes()[: training.layers], 4, rate, lr.rp.per_packet, ps, 1000, request), rel=1e-12)


def test_ps_needs_a_workload_and_the_prediction(capsys):
    assert main(["--backend", "local", "--ps", "kvstore", "--predict", "--no-plots"]) == 2
    assert "--ps models a workload's data-parallel exchange: it needs --workload" in capsys.readouterr().err
    assert main(["--backend", "local", "--workload", "resnet50", "--ps", "kvstore", "--no-plots"]) == 2
    assert "--predict" in capsys.readouterr().err
