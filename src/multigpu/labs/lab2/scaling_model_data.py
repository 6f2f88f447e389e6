"""The tables of the scaling model (:mod:`multigpu.labs.lab2.scaling_model`): the link and model
presets it draws curves for, and the published measurements it is drawn beside and checked against.

Link and model presets are round figures for orders of magnitude, not benchmarks: the lesson is
in the shapes of the curves. The published points drawn beside them (:data:`PUBLISHED`, from 8 to
256 GPUs: ResNet-152 about 95% -> 90%, AlexNet 78% -> 53%; both ~60M parameters, ResNet-152 16x
the arithmetic per image) were measured on other hardware with another algorithm
(:data:`PUBLISHED_SOURCE`), so curves near them show the same shape, not a validated model; so
was Baidu's 31x on 40 GPUs for a large recurrent model (:data:`PUBLISHED_BY`).

The check on real hardware is :data:`BENCHMARKS`: published multi-node efficiencies (Horovod's
P100s over 25 Gb/s RoCE, TensorFlow's K80s with parameter servers over 10 Gb/s) with their GPUs'
measured single-GPU throughput, links and algorithms.
:func:`multigpu.labs.lab2.scaling_model.benchmark_table` puts each beside the model's bounds
(nothing overlapped, the whole backward pass overlapped).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A link between devices: ``latency_s`` per message, ``bandwidth`` in bytes/s (one direction)."""

    name: str
    latency_s: float
    bandwidth: float

    def __str__(self) -> str:
        return f"{self.name} ({self.latency_s * 1e6:.0f} us, {self.bandwidth / 1e9:.2f} GB/s)"


#: Round figures: usable bandwidth per direction and a per-message latency that includes the
#: software stack (TCP for Ethernet without RDMA).
LINKS: dict[str, Link] = {
    "PCIe": Link("PCIe 3.0 x16", 10e-6, 12e9),
    "NVLink": Link("NVLink", 5e-6, 50e9),
    "25GbE": Link("25 Gb/s Ethernet", 100e-6, 25e9 / 8),
    "100GbE": Link("100 Gb/s Ethernet", 100e-6, 100e9 / 8),
}

#: The interconnects of GPU servers by generation: the signalling rate per direction from each
#: standard or vendor (bytes/s; usable is about 80-90% of it), and a per-message latency as an
#: order of magnitude (a few microseconds within a server and over RDMA, tens over TCP). Within a
#: server: PCIe (PCI-SIG: 8, 16, 32 GT/s per lane, x16), NVLink per GPU, all links together
#: (NVIDIA's V100, A100 and H100 data sheets: 300, 600, 900 GB/s both directions together).
#: Between servers, one NIC: InfiniBand (InfiniBand Trade Association: EDR 100, HDR 200, NDR 400
#: Gb/s), Ethernet (IEEE 802.3: 10 to 400 Gb/s; over TCP, without RDMA).
INTERCONNECTS: dict[str, Link] = {
    "PCIe 3.0 x16": Link("PCIe 3.0 x16", 5e-6, 15.75e9),
    "PCIe 4.0 x16": Link("PCIe 4.0 x16", 5e-6, 31.5e9),
    "PCIe 5.0 x16": Link("PCIe 5.0 x16", 5e-6, 63e9),
    "NVLink 2 (V100)": Link("NVLink 2 (V100)", 3e-6, 150e9),
    "NVLink 3 (A100)": Link("NVLink 3 (A100)", 3e-6, 300e9),
    "NVLink 4 (H100)": Link("NVLink 4 (H100)", 3e-6, 450e9),
    "10GbE (TCP)": Link("10 Gb/s Ethernet, TCP", 50e-6, 10e9 / 8),
    "25GbE (TCP)": Link("25 Gb/s Ethernet, TCP", 50e-6, 25e9 / 8),
    "100GbE (TCP)": Link("100 Gb/s Ethernet, TCP", 30e-6, 100e9 / 8),
    "InfiniBand EDR": Link("InfiniBand EDR, 100 Gb/s", 2e-6, 100e9 / 8),
    "InfiniBand HDR": Link("InfiniBand HDR, 200 Gb/s", 2e-6, 200e9 / 8),
    "InfiniBand NDR": Link("InfiniBand NDR, 400 Gb/s", 2e-6, 400e9 / 8),
}


@dataclass(frozen=True)
class ModelSpec:
    """What the scaling model needs to know about a network.

    ``flops_per_sample``: FLOPs of one training step for one sample (forward + backward, about
    3x the forward). ``batch``: the usual per-device batch.
    """

    name: str
    params: float
    flops_per_sample: float
    batch: int
    bytes_per_param: int = 4

    @property
    def gradient_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_sample * self.batch

    @property
    def flops_per_param(self) -> float:
        """Arithmetic per gradient element per sample: low means communication-bound."""
        return self.flops_per_sample / self.params


#: Forward multiply-adds x 2 (FLOPs) x 3 (forward + backward) per sample.
MODELS: dict[str, ModelSpec] = {
    # 61.1M parameters (96% in the FC layers), 0.71 G multiply-adds forward at 224x224.
    "AlexNet": ModelSpec("AlexNet", 61.1e6, 3 * 2 * 0.714e9, batch=128),
    # 25.6M parameters, 4.1 G multiply-adds forward.
    "ResNet-50": ModelSpec("ResNet-50", 25.6e6, 3 * 2 * 4.1e9, batch=64),
    # 60.2M parameters, 11.5 G multiply-adds forward: as many parameters as AlexNet, 16x the work.
    "ResNet-152": ModelSpec("ResNet-152", 60.2e6, 3 * 2 * 11.5e9, batch=64),
    # 5 GRU layers, 3000 wide: 5 x 3 gates x (3000x3000 input + 3000x3000 recurrent weights)
    # = 270M parameters, about 1.1 GB of float32. The benchmark's "about 1 TFLOP" is the forward
    # matrix multiplies of a batch of 16 sequences: x 3 for forward + backward, x 2 for the batch of
    # 32 trained here, 6 TFLOP per step (it was once taken as a whole step at 32: 6x too little).
    "GRU-5x3000": ModelSpec("GRU 5x3000", 5 * 3 * (2 * 3000 * 3000 + 2 * 3000), 3 * 1e12 / 16, batch=32),
}

#: FLOP/s a GPU of the published experiments' era sustains on these models (fp32, not peak).
GPU_FLOPS = 6e12

#: Published weak-scaling efficiencies whose shape the presets' curves show (workers -> efficiency).
PUBLISHED = {"ResNet-152": {8: 0.95, 256: 0.90}, "AlexNet": {8: 0.78, 256: 0.53}, "GRU-5x3000": {40: 31 / 40}}
#: Where the AlexNet and ResNet-152 points come from: not the presets' hardware nor the ring.
PUBLISHED_SOURCE = ("MXNet, sharded parameter server (KVStore), K80 GPUs on AWS p2.16xlarge, "
                    "20 Gb/s in a placement group (AWS, 2017)")
#: Each model's published points, as the plot's legend names them.
PUBLISHED_BY = {
    "ResNet-152": "MXNet sharded PS on K80s", "AlexNet": "MXNet sharded PS on K80s",
    # Baidu SVAIL, "Bringing HPC techniques to deep learning" (2017): their ring all-reduce sped a
    # speech model's training up 31x on 40 GPUs against one
    "GRU-5x3000": "Baidu's ring all-reduce, 31x on 40 GPUs",
}


@dataclass(frozen=True)
class Benchmark:
    """A published multi-node measurement, with the hardware and software it ran on.

    ``one_gpu_images_per_s``: one GPU's training throughput on that GPU at that batch (the
    compute the model divides by); ``node_efficiency``: the same source's efficiency on one whole
    node, where it published one (what the GPUs of a node lose to each other over PCIe), else 1.
    """

    source: str
    model: str
    params: float  # parameters: float32 gradients of 4 bytes each
    gpu: str
    batch: int  # per GPU
    one_gpu_images_per_s: float
    gpus: int
    gpus_per_node: int
    nic: Link  # each node's network card
    algorithm: str  # "ring" (one flat ring over every GPU) or "sharded-ps" (``servers`` parameter servers)
    efficiency: float  # published: images/s of all GPUs over gpus x one GPU's
    servers: int = 0
    node_efficiency: float = 1.0

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


#: Horovod's benchmark (the Horovod README, 2017: 32 servers; its docs/benchmarks page, 2018: 128
#: servers): TensorFlow's tf_cnn_benchmarks, batch 64 per GPU, 4 Pascal GPUs per server, RoCE 25
#: Gb/s, NCCL 2's ring. One P100's images/s: TensorFlow's benchmark page (DGX-1, May 2017; the revision below);
#: ResNet-101 is not in that table: ResNet-152's 91.8 scaled by multiply-adds (11.5 G / 7.8 G).
_ROCE = Link("25 Gb/s RoCE", 5e-6, 25e9 / 8)
_HOROVOD = "Horovod README / docs (Uber), TF + Horovod, ring all-reduce (NCCL 2)"
#: TensorFlow's benchmark page, "Amazon EC2 Distributed (K80)" (test date May 2017), as
#: tensorflow/docs_src/performance/benchmarks.md of the tensorflow/tensorflow repository holds it at
#: commit 5984ffefd320c5d71b801ee06079a51b91ea42c0 (the same rows at 6535ed7c270f): p2.8xlarge instances,
#: 8 K80 GPUs each, 10 Gb/s (AWS's instance table), distributed_replicated (the GPUs of an
#: instance sum their gradients, then parameter servers, one per instance but 6 of 8 for
#: InceptionV3 and 4 of 8 for ResNet-152); the one-instance efficiency from its 8-GPU row.
_P2 = Link("10 Gb/s Ethernet (p2.8xlarge)", 50e-6, 10e9 / 8)
_TF = "TensorFlow benchmarks (Google; tensorflow/tensorflow@5984ffe), TF parameter servers"


def _tf_k80(model: str, params: float, batch: int, one: float, eight: float, rows: dict[int, tuple[float, int]]) -> list[Benchmark]:
    return [Benchmark(_TF, model, params, "K80", batch, one, n, 8, _P2, "sharded-ps", rate / (n * one), servers,
                      node_efficiency=eight / (8 * one)) for n, (rate, servers) in rows.items()]


BENCHMARKS: list[Benchmark] = [
    Benchmark(_HOROVOD, model, params, "P100", 64, one, n, 4, _ROCE, "ring", eff)
    for model, params, one, points in (
        ("Inception V3", 23.8e6, 142.0, {128: 0.90, 512: 0.90}),
        ("ResNet-101", 44.5e6, 91.8 * 11.5 / 7.8, {128: 0.90, 512: 0.90}),
        ("VGG-16", 138.4e6, 154.0, {128: 0.79, 512: 0.68}),
    )
    for n, eff in points.items()
] + (
    # images/s on 16, 32, 64 GPUs (2, 4, 8 instances) and the parameter servers of each run
    _tf_k80("Inception V3", 23.8e6, 64, 29.7, 229, {16: (459, 2), 32: (902, 4), 64: (1783, 6)})
    + _tf_k80("ResNet-50", 25.6e6, 64, 52.4, 378, {16: (751, 2), 32: (1388, 4), 64: (2744, 8)})
    + _tf_k80("ResNet-152", 60.2e6, 32, 19.4, 146, {16: (291, 2), 32: (565, 4), 64: (981, 4)})
)
