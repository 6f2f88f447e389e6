from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from multigpu.core import devices


def cpu_info(cores: int) -> devices.MachineInfo:
    return devices.MachineInfo(mode="cpu", cores=cores, gpus=0, gpu_names=(), torch_version=torch.__version__)


def gpu_info(gpus: int, cores: int = 16) -> devices.MachineInfo:
    return devices.MachineInfo(mode="gpu", cores=cores, gpus=gpus, gpu_names=("X",) * gpus, torch_version="")


def test_ideal_factor_is_capped_by_cores_in_cpu_mode():
    info = cpu_info(2)
    assert [devices.ideal_factor(n, info) for n in (1, 2, 3, 4, 8)] == [1, 2, 2, 2, 2]


def test_ideal_factor_is_capped_by_gpus_in_gpu_mode():
    info = gpu_info(4, cores=64)
    assert [devices.ideal_factor(n, info) for n in (1, 2, 4)] == [1, 2, 4]
    assert devices.ideal_factor(8, info) == 8  # more workers than GPUs: CPU workers, capped by the 64 cores


def test_fewer_gpus_than_workers_means_cpu_workers_and_says_so():
    one_gpu = gpu_info(1, cores=2)
    assert devices.for_workers(1, one_gpu) == one_gpu  # one worker: its GPU
    cpu = devices.for_workers(4, one_gpu)
    assert (cpu.mode, cpu.gpus, cpu.idle_gpus, cpu.backend) == ("cpu", 0, 1, "gloo")
    assert devices.ideal_factor(4, one_gpu) == 2  # min(4 workers, 2 cores), not the 1 GPU
    assert devices.job_env(4, one_gpu) == {"MULTIGPU_FORCE_CPU": "1"}
    assert devices.job_env(1, one_gpu) == {} and devices.job_env(4, gpu_info(4)) == {}
    text = devices.describe(workers=4, info=one_gpu)
    assert "CPU mode on a machine with 1 GPU" in text and "4 workers need 4 GPUs" in text and "x2" in text
    assert "GPU mode" in devices.describe(workers=4, info=gpu_info(4))


def fake_gpus(monkeypatch, n: int) -> None:
    """This process sees ``n`` CUDA devices (torch's queries only; nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: f"Simulated GPU {i}")


def test_a_notebook_on_one_gpu_uses_cpu_workers_for_a_four_worker_lab(monkeypatch):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("MULTIGPU_FORCE_CPU", "0")  # restored after the test; use() overwrites it
    assert devices.detect().mode == "gpu"
    info = devices.use(workers=4)
    assert os.environ["MULTIGPU_FORCE_CPU"] == "1"  # every later run of the notebook, its workers too
    assert (info.mode, info.idle_gpus) == ("cpu", 1) and devices.detect().mode == "cpu"
    assert "every worker runs on the CPU" in devices.describe(workers=4, info=info)
    assert "MULTIGPU_FORCE_CPU=1 is set" in devices.describe(info=info)  # a later cell without workers


def test_a_notebook_with_enough_gpus_keeps_them(monkeypatch):
    fake_gpus(monkeypatch, 4)
    monkeypatch.setenv("MULTIGPU_FORCE_CPU", "0")
    assert devices.use(workers=4).mode == "gpu" and os.environ["MULTIGPU_FORCE_CPU"] == "0"


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


PIN_PROBE = """
import os, sys, threading, time
from multigpu.core import devices
early = threading.Thread(target=time.sleep, args=(1.0,))  # a thread that exists before the pin
early.start()
core = devices.pin_worker(int(sys.argv[1]), int(sys.argv[2]), devices.MachineInfo("cpu", 2, 0, (), ""))
later = {}
t = threading.Thread(target=lambda: later.update(cpus=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
early_cpus = sorted(os.sched_getaffinity(early.native_id))
print(core, sorted(os.sched_getaffinity(0)), early_cpus, later["cpus"])
"""


def _pin(local_rank: int, local_size: int, **env: str) -> list:
    out = subprocess.run([sys.executable, "-c", PIN_PROBE, str(local_rank), str(local_size)], capture_output=True,
                         text=True, check=True, timeout=60, env={**os.environ, **env}).stdout.split(" ", 1)
    return [out[0], out[1].strip()]


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to pin to")
def test_pin_worker_puts_every_thread_of_a_worker_on_its_own_core():
    cores = sorted(os.sched_getaffinity(0))
    core, cpus = _pin(1, 2)
    assert int(core) == cores[1], "local rank 1 runs on the second core"
    assert cpus == f"[{cores[1]}] [{cores[1]}] [{cores[1]}]", \
        "the main thread, a thread started before the pin and one started after all run on that core"
    n = len(cores)
    core, cpus = _pin(n, n + 2)
    assert int(core) == cores[0], f"with more workers than cores, local rank {n} shares the first core"


@pytest.mark.slow
def test_pin_worker_leaves_single_workers_and_opted_out_runs_alone():
    everything = sorted(os.sched_getaffinity(0))
    core, cpus = _pin(0, 1)
    assert core == "None" and cpus.startswith(str(everything)), "a single worker may use every core"
    core, cpus = _pin(1, 2, MULTIGPU_PIN="0")
    assert core == "None" and cpus.startswith(str(everything)), "MULTIGPU_PIN=0 turns pinning off"
