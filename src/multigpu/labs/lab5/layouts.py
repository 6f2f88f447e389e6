"""Lab 5, part 7: choosing a layout: tensor, pipeline and data degrees, and a ZeRO stage.

Lab 4's ``model_parallel_degree`` asked how many GPUs one copy of a model's training state
needs. :func:`choose` extends it to a whole cluster of ``nodes`` servers of ``g`` devices each,
with two rules of Narayanan et al. 2021 ("Efficient large-scale language model training on GPU
clusters using Megatron-LM", SC'21) and ZeRO for the rest:

1. the model-parallel degree ``k = t x p`` is the smallest divisor of the device count whose
   per-device share of the state (ZeRO's accounting of :mod:`~multigpu.labs.lab5.memory`,
   sharded over the data degree ``d = devices / k`` at the chosen stage), plus the activations,
   fits a device (takeaway #2, section 3.3: a model-parallel size just large enough that the
   model fits, data parallelism for the rest);
2. tensor parallelism all-reduces activations in every layer, forward and backward: it goes
   where the links are fastest, inside a server, up to its number of devices when the server's
   link is faster than the network (takeaway #1, section 3.2). ``t`` is the largest divisor of
   ``k`` that also divides ``g``, so that each tensor-parallel group fills part of one server,
   never two; pipeline parallelism, which sends activations only between stages, takes the rest
   across servers (``p = k / t``);
3. data parallelism takes every device left (``d``), and ZeRO (Rajbhandari et al. 2020) shards
   its state at the chosen stage.

The rule gives the least model parallelism memory allows. :data:`PUBLISHED` holds four published
trainings with their own degrees and hardware; :func:`against_published` sets each beside the
rule. The notebook shows which of the rule's facts they all share (tensor parallelism inside a
server; at least the memory's minimum of model parallelism; data parallelism for the rest) and
by how much they went beyond the minimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from multigpu.labs.lab2.scaling_model_data import LINKS, Link
from multigpu.labs.lab5.memory import zero_bytes

GB = 1e9


@dataclass(frozen=True)
class Layout:
    """Degrees of tensor (``tensor``), pipeline (``pipeline``) and data (``data``) parallelism,
    the ZeRO stage over the data degree, and each device's bytes of model state."""

    tensor: int
    pipeline: int
    data: int
    zero_stage: int
    state_bytes: float

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline

    def __str__(self) -> str:
        return (f"TP {self.tensor} x PP {self.pipeline} x DP {self.data} (ZeRO {self.zero_stage}), "
                f"{self.state_bytes / GB:.1f} GB of state per device")


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, smallest first."""
    return [k for k in range(1, n + 1) if n % k == 0]


def choose(parameters: float, device_bytes: float, devices_per_node: int, nodes: int, *,
           intra: Link = LINKS["NVLink"], inter: Link = LINKS["100GbE"], activation_bytes: float = 0.0,
           zero_stage: int = 0, optimizer: str = "mixed adam") -> Layout:
    """The layout of the module's rules for ``parameters`` on ``nodes`` servers of
    ``devices_per_node`` devices of ``device_bytes`` each, linked inside a server by ``intra`` and
    between servers by ``inter``; ValueError when nothing fits."""
    devices = devices_per_node * nodes
    if activation_bytes >= device_bytes:
        raise ValueError("the activations alone fill a device: recompute them (checkpointing) or shrink the micro-batch")
    for k in divisors(devices):
        d = devices // k
        state = zero_bytes(parameters / k, zero_stage, d, optimizer)
        if state + activation_bytes <= device_bytes:
            t = math.gcd(k, devices_per_node) if intra.bandwidth > inter.bandwidth else 1
            return Layout(t, k // t, d, zero_stage, state)
    raise ValueError(f"{parameters:.3g} parameters do not fit on {devices} devices of {device_bytes / GB:.0f} GB "
                     f"even split {devices} ways")


@dataclass(frozen=True)
class Published:
    """A published training run: what it trained on, the degrees it used, and where it says so."""

    name: str
    parameters: float
    devices_per_node: int
    nodes: int
    device_bytes: float
    tensor: int
    pipeline: int
    data: int
    zero_stage: int
    source: str

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes


PUBLISHED = (
    Published("Megatron-LM 8.3B (2019)", 8.3e9, 16, 32, 32 * 2**30, 8, 1, 64, 0,
              "Shoeybi et al. 2019, arXiv 1909.08053: section 5 (32 DGX-2H servers, 512 V100 32 GB), "
              "Table 1 (8.3B: 8-way model parallel, 512 GPUs), Figure 8 (8-way model x 64-way data parallel)"),
    Published("GPT 1T, Megatron-LM (2021)", 1008e9, 8, 384, 80e9, 8, 64, 6, 0,
              "Narayanan et al. 2021 (SC'21), arXiv 2104.04473: Table 1, 1008.0B row (tensor 8, pipeline 64, "
              "3072 GPUs); section 5: DGX A100 nodes of 8 x 80 GB A100"),
    Published("BLOOM 176B (2022)", 176e9, 8, 48, 80e9, 4, 12, 8, 1,
              "BigScience, arXiv 2211.05100 (the model); its training's README, bigscience-workshop/bigscience "
              "train/tr11-176B-ml: 'Hardware' (48 nodes of 8 A100 80 GB), 'Replica setup' (TP=4, PP=12, DP=8), "
              "'Deepspeed config' (the BF16 optimizer's own ZeRO stage 1)"),
    Published("Llama 3 405B (2024)", 405e9, 8, 2048, 80e9, 8, 16, 128, 2,
              "Llama Team, arXiv 2407.21783: section 3.3.1 (H100 80 GB, 8 per server), section 3.3.2 and Table 4 "
              "(16,384 GPUs: TP 8, CP 1, PP 16, DP 128); its FSDP shards optimizer states and gradients and does "
              "not reshard the weights after forward (section 3.3.2): ZeRO stage 2's bytes during a step"),
)


@dataclass(frozen=True)
class Check:
    """A published run beside the rule, and the rule's facts it shares."""

    run: Published
    rule: Layout  #: the rule's layout for the run's hardware and ZeRO stage, state only
    tensor_inside_server: bool
    at_least_the_minimum: bool
    data_is_the_rest: bool
    state_fits: bool

    @property
    def beyond_minimum(self) -> float:
        """Published model parallelism over the rule's minimum (1: exactly the minimum)."""
        return (self.run.tensor * self.run.pipeline) / self.rule.model_parallel


def against_published(activation_bytes: float = 0.0) -> list[Check]:
    """Each :data:`PUBLISHED` run beside :func:`choose` for its hardware and ZeRO stage."""
    out = []
    for run in PUBLISHED:
        rule = choose(run.parameters, run.device_bytes, run.devices_per_node, run.nodes,
                      activation_bytes=activation_bytes, zero_stage=run.zero_stage)
        k = run.tensor * run.pipeline
        state = zero_bytes(run.parameters / k, run.zero_stage, run.data)
        out.append(Check(run, rule, run.tensor <= run.devices_per_node, k >= rule.model_parallel,
                         run.data * k == run.devices, state <= run.device_bytes))
    return out
