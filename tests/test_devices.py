from __future__ import annotations

import torch

from multigpu import devices


def cpu_info(cores: int) -> devices.MachineInfo:
    return devices.MachineInfo(mode="cpu", cores=cores, gpus=0, gpu_names=(), torch_version=torch.__version__)


def gpu_info(gpus: int, cores: int = 16) -> devices.MachineInfo:
    return devices.MachineInfo(mode="gpu", cores=cores, gpus=gpus, gpu_names=("X",) * gpus, torch_version="")


def test_ideal_factor_is_capped_by_cores_in_cpu_mode():
    info = cpu_info(2)
    assert [devices.ideal_factor(n, info) for n in (1, 2, 3, 4, 8)] == [1, 2, 2, 2, 2]


def test_ideal_factor_is_capped_by_gpus_in_gpu_mode():
    info = gpu_info(4, cores=64)
    assert [devices.ideal_factor(n, info) for n in (1, 4, 8)] == [1, 4, 4]


def test_ideal_factor_rejects_zero_workers():
    import pytest

    with pytest.raises(ValueError):
        devices.ideal_factor(0, cpu_info(2))


def test_threads_per_worker_shares_the_cores():
    assert devices.threads_per_worker(1, cpu_info(8)) == 8
    assert devices.threads_per_worker(2, cpu_info(8)) == 4
    assert devices.threads_per_worker(4, cpu_info(2)) == 1


def test_detect_matches_torch(monkeypatch):
    info = devices.detect()
    assert info.mode == ("gpu" if torch.cuda.is_available() else "cpu")
    assert info.cores >= 1
    monkeypatch.setenv("MULTIGPU_FORCE_CPU", "1")
    forced = devices.detect()
    assert forced.mode == "cpu" and forced.gpus == 0 and forced.backend == "gloo"


def test_worker_device_in_cpu_mode_is_the_cpu():
    assert devices.worker_device(3, cpu_info(2)) == torch.device("cpu")


def test_describe_names_the_mode_and_the_ideal():
    text = devices.describe(workers=4, info=cpu_info(2))
    assert "CPU mode" in text and "x2" in text


def test_horovod_build_reports_gloo():
    build = devices.horovod_build()
    assert build["installed"] and build["pytorch"] and build["gloo"]
