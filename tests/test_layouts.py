"""multigpu.labs.lab5.layouts: the rule, and the published runs beside it."""

from __future__ import annotations

import pytest

from multigpu.labs.lab2.scaling_model_data import LINKS
from multigpu.labs.lab5 import layouts, memory

V100 = 32 * 2**30


def test_megatron_lm_8_3b_is_the_rule_with_room_for_activations():
    # 8.3e9 x 16 B / 4 = 33.2 GB: 4 GPUs only with no activations at all (Lab 4)
    assert layouts.choose(8.3e9, V100, 16, 32).model_parallel == 4
    for activations in (2e9, 4e9, 16e9):
        got = layouts.choose(8.3e9, V100, 16, 32, activation_bytes=activations)
        assert (got.tensor, got.pipeline, got.data) == (8, 1, 64)


def test_tensor_parallel_stays_inside_a_server_and_pipeline_crosses():
    got = layouts.choose(175e9, 80e9, 8, 64, activation_bytes=10e9)
    assert got.tensor == 8 and got.pipeline >= 2 and got.tensor * got.pipeline * got.data == 512
    pcie = layouts.choose(175e9, 80e9, 8, 64, activation_bytes=10e9, intra=LINKS["PCIe"], inter=LINKS["25GbE"])
    assert pcie.tensor == 8  # PCIe beats 25 Gb/s Ethernet (not 100 Gb/s: 12 against 12.5 GB/s)
    flat = layouts.choose(175e9, 80e9, 8, 64, activation_bytes=10e9, intra=LINKS["25GbE"], inter=LINKS["100GbE"])
    assert flat.tensor == 1 and flat.pipeline == got.model_parallel


def test_zero_shrinks_the_model_parallel_degree():
    plain = layouts.choose(70e9, 80e9, 8, 16)
    zero1 = layouts.choose(70e9, 80e9, 8, 16, zero_stage=1)
    zero3 = layouts.choose(70e9, 80e9, 8, 16, zero_stage=3)
    assert plain.model_parallel > zero1.model_parallel >= zero3.model_parallel == 1
    assert zero3.state_bytes == pytest.approx(memory.zero_bytes(70e9, 3, 128))


def test_nothing_fits_raises():
    with pytest.raises(ValueError):
        layouts.choose(1e12, 16e9, 8, 1)
    with pytest.raises(ValueError):
        layouts.choose(1e9, 16e9, 8, 1, activation_bytes=16e9)


def test_every_published_run_shares_the_rules_facts():
    checks = layouts.against_published()
    assert {c.run.name.split(" (")[0] for c in checks} == {"Megatron-LM 8.3B", "GPT 1T, Megatron-LM", "BLOOM 176B",
                                                           "Llama 3 405B"}
    for c in checks:
        assert c.tensor_inside_server and c.at_least_the_minimum and c.data_is_the_rest and c.state_fits, c
        assert c.run.source
    by_name = {c.run.name.split(" (")[0]: c for c in checks}
    assert by_name["Megatron-LM 8.3B"].beyond_minimum == 2  # state only: 4; they used 8
    # stage 2 over 1024-way data parallelism: the bf16 weights (2 B each) alone ask for 16-way model parallelism
    assert by_name["Llama 3 405B"].rule.model_parallel == 16 and by_name["Llama 3 405B"].beyond_minimum == 8
