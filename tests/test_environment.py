"""The environment: one list of pins (pyproject.toml) that environment.yml repeats exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import REPO, VENV_BIN
from multigpu.running import launch


def pins_pyproject() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(d.split("==", 1) for d in deps)


def pins_environment_yml() -> dict[str, str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return dict(p.split("==", 1) for p in pip if "==" in p)


def test_every_dependency_is_pinned_exactly():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    loose = [d for d in deps if not re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.+]*", d)]
    assert not loose, f"pin these exactly (name==version): {loose}"


def test_environment_yml_has_the_same_pins_as_pyproject():
    assert pins_environment_yml() == pins_pyproject()


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    wrong = {}
    for name, pin in pins_pyproject().items():
        got = version(name).split("+")[0]
        if got != pin:
            wrong[name] = (pin, got)
    assert not wrong, f"installed versions differ from the pins (pin, installed): {wrong}; run 'make setup'"
    assert sys.version_info[:2] == (3, 11)


@pytest.mark.slow
def test_horovod_is_built_with_pytorch_mpi_and_gloo():
    out = subprocess.run([str(VENV_BIN / "horovodrun"), "--check-build"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for need in ("PyTorch", "MPI", "Gloo"):
        assert re.search(rf"\[X\] {need}", out.stdout), out.stdout
    assert launch.horovod_controller() == "mpi"  # the course's default: MPI's shared memory on one machine


@pytest.mark.slow
def test_horovods_extension_loads_mpi_and_torch_from_this_venv():
    """A cached wheel carries the RUNPATH of the venv it was built in. Loaded from another clone's
    venv, MPI vanished inside the grading sandbox (which hides /tmp) and horovodrun said "MPI
    support has not been built": tools/install_horovod.sh points it at this venv, relatively."""
    import horovod

    prefix = Path(sys.prefix).resolve()
    exts = sorted(Path(horovod.__file__).parent.glob("*/mpi_lib*.so"))
    assert exts, "no Horovod extension found: run 'make setup'"
    for ext in exts:
        found = subprocess.run(["ldd", str(ext)], capture_output=True, text=True, timeout=60,
                               env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}).stdout
        libs = dict(re.findall(r"^\s*(\S+) => (\S+)", found, re.M))
        for lib in ("libmpi.so.12", "libtorch_cpu.so"):
            assert lib in libs, f"{ext.name} does not load {lib}:\n{found}"
            assert prefix in Path(libs[lib]).resolve().parents, (
                f"{ext.name} loads {lib} from {libs[lib]}, outside this venv ({prefix}): "
                "rerun tools/install_horovod.sh")
