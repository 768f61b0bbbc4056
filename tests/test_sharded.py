"""Sharded training (``--workload NAME --sharded``, FSDP's schedule): the schedule by hand, every call exact
against numpy with each call's own collective, every link's bytes as the planner predicts, the model
beside the fabric, and the one-line refusals."""

import pytest

from innet.api import spec_of
from innet.backends.local.run import LocalRun
from innet.errors import UserError
from innet.hosts.training import Training, run_schedule, sharded_calls
from innet.planning.spec import MODES
from innet.planning.timing import predict


def test_fsdp_order_prefetches_one_layer():
    assert sharded_calls(3) == [("forward", 0), ("forward", 1), ("forward", 2), ("backward", 2), ("backward", 1),
                                ("gradient", 2), ("backward", 0), ("gradient", 1), ("gradient", 0)]


def test_the_sharded_schedule_by_hand():
    """Two layers (forward 1 s and 2 s, backward 2 s and 4 s), every call 0.5 s. Iteration 0: F0 0-0.5, f0
    0.5-1.5; F1 (issued as f0 starts) 0.5-1, f1 1.5-3.5; B1 (as f1 starts) 1.5-2, b1 3.5-7.5; B0 (as b1 starts)
    3.5-4, b0 7.5-9.5; G1 (b1 done) 7.5-8; G0 (b0 done) 9.5-10. Iteration 1 starts at 9.5, its F0 waits for G0."""
    calls = sharded_calls(2)
    training = Training(3.0, tuple({"gradient": (2.0, 4.0)[i]}.get(p, 0.0) for p, i in calls),
                        layer=tuple(i for _, i in calls), forward_layers=(1.0, 2.0), phases=tuple(p for p, _ in calls))
    assert training.compute == 9.0 and [training.collective(k) for k in range(6)] == [
        "all_gather", "all_gather", "all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    starts, ends = run_schedule(training, [0.5] * 12)
    assert ends[:6] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    # iteration 1: F0 10-10.5, f0 10.5-11.5, F1 10.5-11, f1 11.5-13.5, B1 11.5-12, b1 13.5-17.5, B0 13.5-14,
    # b0 17.5-19.5, G1 17.5-18, G0 19.5-20
    assert ends[6:] == [10.5, 11.0, 12.0, 14.0, 18.0, 20.0]
    assert starts == [0.0, 9.5, 19.5]


def measured(**options):
    """(the run's spec, its record, the timing model's figures for it)."""
    spec, graph = spec_of("star", default_backend="local", plots=False, **options)
    local = LocalRun(graph, spec)
    record = local.finish()
    return spec, record, predict(graph, spec, list(local.rp.plans), local.rp.per_packet, 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_a_sharded_workload_is_exact_with_the_planners_bytes(mode):
    """Star of 4, ResNet-50 at 1/1000 (54 layers of 1 to 2,359 values, 162 calls an iteration), an iteration
    lossless and one under 10% loss, duplication and reordering: each rank holds each all-gather's whole layer and
    its shard of each reduce-scatter, exactly; every link's bytes are the planner's, call by call."""
    options = dict(workers=4, workload="resnet50", workload_scale=0.001, iterations=1, sharded=True, mode=mode,
                   packet_elements=256)
    spec, record, _ = measured(**options)
    assert record.correct, record.errors
    assert record.link_bytes == record.predicted_link_bytes
    assert [c.name for c in spec.call_collectives()[:3]] == ["all_gather"] * 3 and len(spec.call_sizes()) == 3 * 54
    faulty = measured(**options, loss=0.1, dup=0.05, reorder=0.05)[1]
    assert faulty.correct, faulty.errors
    assert faulty.result_digest == record.result_digest


def test_sharded_against_ddp_bytes_and_model():
    """In the switches a worker's link carries, per layer, an all-gather twice (its shard up, the layer down)
    and a reduce-scatter (the layer up, its shard down): 3 + 3/N layers against all-reduce's 2, plus headers.
    The timing model's iteration time is within 10% of the fabric's for both."""
    options = dict(workers=4, workload="resnet50", iterations=2, packet_elements=256, compute_scale=100)
    _, ddp, ddp_model = measured(**options)
    _, fsdp, fsdp_model = measured(**options, sharded=True)
    assert ddp.correct and fsdp.correct
    ratio = fsdp.tier_bytes["host-tor"] / ddp.tier_bytes["host-tor"]
    assert 3.75 / 2 <= ratio < 3.75 / 2 * 1.05
    for record, model in ((ddp, ddp_model), (fsdp, fsdp_model)):
        assert record.figures["iteration_s"] == pytest.approx(model["iteration_s"], rel=0.1)
    assert fsdp.figures["iteration_s"] > ddp.figures["iteration_s"]  # the all-gathers gate each layer's compute


@pytest.mark.parametrize("options, message", [
    (dict(sharded=True), "sharded runs a workload's layers in FSDP's schedule: it needs workload"),
    (dict(sharded=True, workload="resnet50", slice_elements=5000), "FSDP's own schedule: it takes neither slice_elements"),
    (dict(sharded=True, workload="resnet50", program="forward"), "program forward serves allreduce only: sharded needs all_gather"),
    (dict(sharded=True, workload="resnet50", collective="reduce"), "collective reduce runs on seeded tensors"),
])
def test_sharded_refusals_are_one_line(options, message):
    with pytest.raises(UserError) as info:
        spec_of("star", default_backend="local", **options)
    assert message in str(info.value) and "\n" not in str(info.value)
