"""Training workloads: a model's gradient tensors, in forward order, with a compute-time model.

A workload is the list of a model's layers as data-parallel training sees them:
each layer's name, its parameter count (the gradient it all-reduces each
iteration) and its share of the compute. Parameter counts are computed from
the architectures (and match the reference implementations: torchvision's
ResNet-50 25,557,032 and VGG-19 143,667,240; BERT-base-uncased 109,482,240 with
its pooler). A layer groups a module's parameter tensors (a convolution with
its batch norm, a linear map with its bias), as gradient bucketing would.

Compute time: a layer's forward and backward time are proportional to its
multiply-accumulate count (MACs) at the model's input size (224x224 images,
128-token sequences), with backward = 2x forward, scaled so one iteration's
compute (forward + backward) takes ``iteration_compute`` seconds — by default a
published-order figure for one V100 GPU at batch 32 (ResNet-50 ~0.10 s, VGG-19
~0.20 s, BERT-base at 32 x 128 tokens ~0.15 s). ``scale`` shrinks every layer's
element count (and the compute, in proportion) so a run fits an emulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from innet.errors import UserError


@dataclass(frozen=True)
class Layer:
    name: str
    elements: int
    macs: int  # multiply-accumulates of its forward pass at the model's input size


@dataclass(frozen=True)
class Workload:
    name: str
    layers: tuple[Layer, ...]  # forward order
    iteration_compute: float  # seconds of forward + backward at full size

    @property
    def parameters(self) -> int:
        return sum(layer.elements for layer in self.layers)

    def scaled(self, scale: float) -> Workload:
        """Every layer's elements (at least 1) and the compute shrunk by ``scale``."""
        if not 0 < scale <= 1:
            raise UserError(f"{{workload_scale}} must be in (0, 1], got {scale:g}")
        layers = tuple(Layer(la.name, max(1, round(la.elements * scale)), la.macs) for la in self.layers)
        return Workload(self.name, layers, self.iteration_compute * scale)

    def forward_times(self) -> list[float]:
        total = sum(la.macs for la in self.layers)
        return [self.iteration_compute / 3 * la.macs / total for la in self.layers]

    def backward_times(self) -> list[float]:
        """Backward time of each layer (forward order); backward runs them last to first."""
        return [2 * t for t in self.forward_times()]


def _conv(name: str, cin: int, cout: int, k: int, out_hw: int, bias: bool = False, bn: bool = True) -> Layer:
    params = cin * cout * k * k + (cout if bias else 0) + (2 * cout if bn else 0)
    return Layer(name, params, cin * cout * k * k * out_hw * out_hw)


def _linear(name: str, fan_in: int, fan_out: int, tokens: int = 1) -> Layer:
    return Layer(name, fan_in * fan_out + fan_out, fan_in * fan_out * tokens)


def resnet50() -> Workload:
    layers = [_conv("conv1", 3, 64, 7, 112)]
    cin, hw = 64, 56
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True), start=2):
        for b in range(blocks):
            out_hw = hw // 2 if b == 0 and stage > 2 else hw
            pre = f"conv{stage}_{b + 1}"
            layers.append(_conv(f"{pre}a", cin, width, 1, hw if b == 0 else out_hw))
            layers.append(_conv(f"{pre}b", width, width, 3, out_hw))
            layers.append(_conv(f"{pre}c", width, 4 * width, 1, out_hw))
            if b == 0:
                layers.append(_conv(f"{pre}_down", cin, 4 * width, 1, out_hw))
            cin, hw = 4 * width, out_hw
    layers.append(_linear("fc", 2048, 1000))
    return Workload("resnet50", tuple(layers), 0.10)


def vgg19() -> Workload:
    layers, cin, hw = [], 3, 224
    for block, (width, convs) in enumerate(zip((64, 128, 256, 512, 512), (2, 2, 4, 4, 4), strict=True), start=1):
        for c in range(convs):
            layers.append(_conv(f"conv{block}_{c + 1}", cin, width, 3, hw, bias=True, bn=False))
            cin = width
        hw //= 2
    layers += [_linear("fc6", 512 * 7 * 7, 4096), _linear("fc7", 4096, 4096), _linear("fc8", 4096, 1000)]
    return Workload("vgg19", tuple(layers), 0.20)


def bert_base(seq: int = 128) -> Workload:
    d, ff, vocab = 768, 3072, 30522
    layers = [Layer("embeddings", (vocab + 512 + 2) * d + 2 * d, 0)]
    for i in range(12):
        attn = _linear("", d, d, seq)
        layers.append(Layer(f"layer{i}.attention", 4 * attn.elements + 2 * d, 4 * attn.macs + 2 * seq * seq * d))
        up, down = _linear("", d, ff, seq), _linear("", ff, d, seq)
        layers.append(Layer(f"layer{i}.ffn", up.elements + down.elements + 2 * d, up.macs + down.macs))
    layers.append(_linear("pooler", d, d))
    return Workload("bert-base", tuple(layers), 0.15)


WORKLOADS = {"resnet50": resnet50, "vgg19": vgg19, "bert-base": bert_base}


def load_workload(name: str, scale: float = 1.0) -> Workload:
    if name not in WORKLOADS:
        raise UserError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    workload = WORKLOADS[name]()
    return workload if scale == 1 else workload.scaled(scale)
