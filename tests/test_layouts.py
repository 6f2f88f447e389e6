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
    # 384 GPUs are 3 x 128: ZeRO 1 over d = 384 / k, 176e9 / k x (4 + 12 / d) bytes: k = 8 gives 93.5 GB, k = 12
    # 64.2 GB; t = gcd(12, 8) = 4 (BLOOM's own tensor degree), p = 3, d = 32; BLOOM's 48-way is 4 x it
    bloom = by_name["BLOOM 176B"]
    assert degrees(bloom.rule) == (4, 3, 32) and bloom.beyond_minimum == 4


def degrees(layout):
    return layout.tensor, layout.pipeline, layout.data


def test_six_gpu_servers_use_every_device_and_the_state_they_are_sized_for():
    # 4 servers of 6 x 80 GB, 24 devices (divisors 1 2 3 4 6 8 12 24), 16 bytes per parameter:
    # 30e9 x 16 B = 480 GB needs k >= 6: k = 6, 80 GB each; t = gcd(6, 6) = 6, p = 1, d = 24 / 6 = 4
    six = layouts.choose(30e9, 80e9, 6, 4)
    assert degrees(six) == (6, 1, 4) and six.state_bytes == pytest.approx(80e9)
    # 50e9 x 16 B = 800 GB needs k >= 10: k = 12 (no 10 divides 24), 66.7 GB; t = gcd(12, 6) = 6, p = 2, d = 2
    twelve = layouts.choose(50e9, 80e9, 6, 4)
    assert degrees(twelve) == (6, 2, 2) and twelve.state_bytes == pytest.approx(800e9 / 12)
    # 12e9 x 16 B = 192 GB needs k >= 2.4: k = 3; t = gcd(3, 6) = 3, p = 1, d = 8
    assert degrees(layouts.choose(12e9, 80e9, 6, 4)) == (3, 1, 8)


def test_ten_gpu_servers():
    # 3 servers of 10 x 80 GB, 30 devices (divisors 1 2 3 5 6 10 15 30)
    # 70e9 x 16 B = 1120 GB needs k >= 14: k = 15, 74.7 GB; t = gcd(15, 10) = 5, p = 3, d = 2
    got = layouts.choose(70e9, 80e9, 10, 3)
    assert degrees(got) == (5, 3, 2) and got.state_bytes == pytest.approx(1120e9 / 15)
    # 20e9 x 16 B = 320 GB needs k >= 4: k = 5, 64 GB; t = 5, p = 1, d = 6
    assert degrees(layouts.choose(20e9, 80e9, 10, 3)) == (5, 1, 6)


def test_twelve_gpu_servers():
    # 2 servers of 12 x 80 GB, 24 devices
    # 35e9 x 16 B = 560 GB needs k >= 7: k = 8, 70 GB; t = gcd(8, 12) = 4 (8 does not divide 12), p = 2, d = 3
    assert degrees(layouts.choose(35e9, 80e9, 12, 2)) == (4, 2, 3)
    # ZeRO stage 1, 60e9 parameters: per device 60e9 / k x (4 + 12 / d): k = 4, d = 6: 90 GB; k = 6, d = 4:
    # 10e9 x 7 = 70 GB fits; t = gcd(6, 12) = 6, p = 1
    zero1 = layouts.choose(60e9, 80e9, 12, 2, zero_stage=1)
    assert degrees(zero1) == (6, 1, 4) and zero1.state_bytes == pytest.approx(70e9)
    # 3 servers, 36 devices: 150e9 x 16 B = 2400 GB needs k >= 30: k = 36, 66.7 GB; t = 12, p = 3, d = 1
    assert degrees(layouts.choose(150e9, 80e9, 12, 3)) == (12, 3, 1)


def test_every_layout_tiles_the_cluster():
    for g in (4, 6, 8, 10, 12, 16):
        for nodes in (1, 2, 3, 5):
            for parameters in (1e9, 7e9, 30e9, 70e9):
                try:
                    got = layouts.choose(parameters, 80e9, g, nodes)
                except ValueError:
                    continue
                assert got.tensor * got.pipeline * got.data == g * nodes
                assert g % got.tensor == 0 and got.state_bytes <= 80e9
