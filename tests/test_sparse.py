"""Top-k sparse aggregation: selection with error feedback, the wire form, and exact sums in the switch and PBox."""

import numpy as np
import pytest

from innet.backends.local.run import LocalRun, run_local
from innet.cli import main
from innet.errors import UserError
from innet.hosts.job import JobSpec, make_tensors
from innet.hosts.worker.call import AllreduceCall
from innet.planning.spec import RunSpec
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchConfig, SwitchRuntime
from innet.wire import fixedpoint
from innet.wire.layer import scapy_frame
from innet.wire.packet import PAYLOAD_OFFSET, RESULT, SPARSE, make_packet, parse_frame
from innet.wire.sparse import decode, encode, sparse_bytes, topk_with_feedback
from topologies import build


def test_encode_decode_round_trip_and_the_shorter_form():
    values = np.zeros(256, np.int32)
    values[[3, 77, 255]] = [5, -9, 2**31 - 1]
    payload = encode(values)
    assert payload.tolist() == [256, 3, 5, 77, -9, 255, 2**31 - 1]
    assert np.array_equal(decode(payload, 256), values)
    assert encode(np.arange(1, 9, dtype=np.int32)) is None  # 8 non-zeros: 17 ints is not shorter than 8
    assert encode(np.zeros(0, np.int32)) is None
    assert sparse_bytes(values) == 4 * 7 and sparse_bytes(np.ones(16, np.int32)) == 64


@pytest.mark.parametrize("payload", [
    [256, 3],  # a pair cut in half
    [300, 3, 5],  # more values than a chunk holds
    [256, 256, 5],  # index past the chunk
    [256, -1, 5],
    [256, 9, 1, 4, 2],  # not ascending
    [256, 9, 1, 9, 2],  # an index twice would double-count
])
def test_malformed_sparse_payloads_are_refused(payload):
    assert decode(np.array(payload, np.int32), 256) is None


def test_topk_keeps_k_entries_and_error_feedback_loses_nothing():
    rng = np.random.default_rng(3)
    tensors = [rng.standard_normal(1000).astype(np.float32) for _ in range(6)]  # 3 iterations of 2 layers
    sent = topk_with_feedback(tensors, 0.05, period=2)
    assert [np.count_nonzero(s) for s in sent] == [50] * 6
    first = sent[0]
    assert set(np.flatnonzero(first)) == set(np.argsort(-np.abs(tensors[0]))[:50])
    for layer in (0, 1):  # nothing is lost: what was computed minus what was sent is the last step's remainder,
        # zero where the last step sent, and no larger than anything it sent (it kept the top k)
        remainder = sum(t.astype(np.float64) for t in tensors[layer::2]) - sum(s.astype(np.float64) for s in sent[layer::2])
        last = sent[layer + 4]
        assert np.allclose(remainder[last != 0], 0, atol=1e-5)
        assert np.abs(remainder).max() <= np.abs(last[last != 0]).min() + 1e-5
    # a dropped entry comes back: the second layer-0 tensor sends entries the first one dropped
    assert np.count_nonzero(sent[2][first == 0]) > 0


def test_sparse_chunk_frames_are_byte_identical_to_scapy():
    spec = JobSpec(job=1, rank=0, nworkers=2, slots=8, elements=16, node=0, first_hop=9, sparse=True)
    tensor = np.zeros(40, np.float32)
    tensor[[2, 5, 17]] = [1.5, -2.0, 0.25]  # chunk 1: two non-zeros (sparse), chunk 2: one, chunk 3 (8 long): none
    tensor[32:40] = 1.0  # chunk 3 is dense: 8 non-zeros in 8 values
    call = AllreduceCall(spec, tensor, first_chunk=0)
    call.start(0.0)
    agreed = call.local_exp
    result = make_packet(None, job=1, rank=0, nworkers=2, slot=0, chunk=0, flags=RESULT, exp=agreed)
    sent = call.receive(result.to_frame(9, 0), 0.001)
    q = fixedpoint.quantize(tensor, fixedpoint.scale_for(agreed, 2))
    assert sent[0] == scapy_frame(0, 9, job=1, rank=0, nworkers=2, slot=1, chunk=1, exp=agreed, flags="SPARSE",
                                  values=[16, 2, int(q[2]), 5, int(q[5])])
    assert sent[1] == scapy_frame(0, 9, job=1, rank=0, nworkers=2, slot=2, chunk=2, exp=agreed, flags="SPARSE",
                                  values=[16, 1, int(q[17])])
    assert sent[2] == scapy_frame(0, 9, job=1, rank=0, nworkers=2, slot=3, chunk=3, exp=agreed,
                                  values=q[32:40].tolist())


@pytest.mark.parametrize("mode,topo,params", [
    ("innet", "leaf-spine", {"racks": 2, "hosts_per_rack": 2}),  # hierarchical: partial sums go up sparse too
    ("innet", "star", {"workers": 5}),
    ("pbox", "leaf-spine", {"racks": 2, "hosts_per_rack": 2}),
])
@pytest.mark.parametrize("loss", [0.0, 0.03])
def test_topk_sums_are_exact_and_move_fewer_bytes(mode, topo, params, loss):
    from innet.wire.faults import FaultSpec

    run = RunSpec(mode=mode, program="topk_sparse", elements=5000, iterations=3, topk=0.02,
                  faults=FaultSpec(loss=loss), timeout=30)
    result = run_local(build(topo, **params), run)
    assert result["correct"], result["errors"]
    assert result["bytes_vs_dense"] < 0.3
    assert result["retransmissions"] > 0 if loss else result["retransmissions"] == 0


def test_uplink_bytes_are_what_the_chunks_encode_to():
    """Each worker's uplink carries the exponent packet and every chunk in its shorter form, exactly."""
    graph = build("star", workers=3)
    run = RunSpec(program="topk_sparse", elements=3000, iterations=2, topk=0.1)
    lr = LocalRun(graph, run)
    result = lr.finish()
    assert result["correct"]
    tensors = {rank: run.tensors(1, rank) for rank in range(3)}
    for rank, host in enumerate(sorted(h for h in graph if graph.nodes[h]["role"] == "host")):
        expected = 0
        for it in range(2):
            q = max(fixedpoint.magnitude_exponent(tensors[r][it]) for r in range(3))
            ints = fixedpoint.quantize(tensors[rank][it], fixedpoint.scale_for(q, 3))
            per = lr.program.elements
            chunks = [ints[i:i + per] for i in range(0, len(ints), per)]
            expected += PAYLOAD_OFFSET + sum(PAYLOAD_OFFSET + sparse_bytes(c) for c in chunks)
        assert lr.fabric.links[(host, "s1")].bytes == expected


def test_the_switch_drops_a_malformed_sparse_chunk():
    from innet.switch.program import JobPort

    job = JobPort(job=1, nworkers=2, children=(0, 1), parent=None, aggregate=True, contributors={0: 0, 1: 1},
                  rank=0, rank_ports={0: 0, 1: 1}, slots=4)
    rt = SwitchRuntime(SwitchConfig("s1", 9, "tor", {0: "s1-eth0", 1: "s1-eth1"}, {0: 0, 1: 1}, {}, {1: job}),
                       load_program("topk_sparse"))
    bad = make_packet(np.array([16, 20, 5], np.int32), job=1, rank=0, nworkers=2, slot=0, chunk=1, flags=SPARSE)
    assert rt.receive(0, bad.to_frame(0, 9), 0.0) == []
    assert rt.ctx.counters == {"drop:bad_sparse": 1}
    good = [make_packet(np.array([16, 3, 7 * r + 1], np.int32), job=1, rank=r, nworkers=2, slot=0, chunk=1,
                        flags=SPARSE).to_frame(r, 9) for r in (0, 1)]
    rt.receive(0, good[0], 0.0)
    out = rt.receive(1, good[1], 0.0)
    assert [parse_frame(f).values.tolist() for _, f in out] == [[16, 3, 1 + 8]] * 2  # the sum, sparse, to both


def test_topk_needs_a_program_that_takes_sparse_chunks(capsys):
    with pytest.raises(UserError, match="topk needs program topk_sparse"):
        run_local(build("star", workers=2), RunSpec(program="sum_allreduce", topk=0.1, elements=100))
    assert main(["--backend", "local", "--topo", "star", "--topk", "2", "--no-plots"]) == 2
    assert "--topk must be a fraction" in capsys.readouterr().err


def test_ring_with_topk_sends_the_same_values_dense():
    graph = build("star", workers=3)
    run = RunSpec(mode="ring", elements=2000, iterations=2, topk=0.1)
    result = run_local(graph, run)
    assert result["correct"] and result["bytes_vs_dense"] == 1.0
    assert np.count_nonzero(run.tensors(1, 0)[0]) == 200 and make_tensors(0, 1, 0, [2000])[0].all()
