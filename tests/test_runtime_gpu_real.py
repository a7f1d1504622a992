"""The runtime stage's GPU pre-flight against a real NVIDIA GPU: the compute capability it reads
through NVML (servelab.hostfacts.gpu_facts) is the one PyTorch's CUDA runtime reports for the
same GPU, the probe finds this Python's PyTorch build (its CUDA and arch list) as it would a
venv runtime's, and the pre-flight passes a build that runs on the GPU and refuses, in one
line naming the GPU, one that does not.

Needs an NVIDIA GPU that NVML sees, nvidia-ml-py and PyTorch with CUDA in this Python; no
vLLM, container engine or network. Elsewhere every test is skipped with the reason.

    python -m pytest tests/test_runtime_gpu_real.py -m gpu -v -rs

The comparisons themselves are covered without a GPU by tests/test_runtime_preflight.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from test_runtime_container import REPO

from servelab.config import load
from servelab.env.runtime.gpu import GpuCheck, arch_runs, check_gpus, preflight, venv_gpu_probe
from servelab.errors import ServelabError
from servelab.experiment import Experiment, RuntimeSection
from servelab.hostfacts.gpu import gpu_facts

pytestmark = pytest.mark.gpu

# PyTorch's compute capability of every GPU, numbered as NVML numbers them
TORCH_CC = (
    "import torch\n"
    "print(' '.join('%d.%d' % torch.cuda.get_device_capability(i)"
    " for i in range(torch.cuda.device_count())))\n"
)


@pytest.fixture(scope="module")
def host() -> dict[str, Any]:
    """NVML's facts of this host's GPUs and this Python's PyTorch build; skips without them."""
    facts = gpu_facts()
    if facts["gpu_reason"]:
        pytest.skip(f"no NVIDIA GPU visible: {facts['gpu_reason']}")
    probe = venv_gpu_probe(sys.executable, runtime(), [], subprocess.run)
    if probe["error"] or not probe["arch_list"]:
        pytest.skip(f"no PyTorch with CUDA in {sys.executable}: {probe['error'] or 'CPU build'}")
    return {"facts": facts, "probe": probe}


def runtime() -> RuntimeSection:
    """The quickstart's runtime section, on a GPU, without its CPU-only variables."""
    exp = Experiment.from_dict(load(REPO / "config" / "config.yaml").to_dict())
    return replace(exp.runtime, device="gpu", env={}, gpu_devices=None)


def test_nvmls_compute_capability_is_pytorchs(host: dict[str, Any]) -> None:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_CC], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    nvml = [g["compute_capability"] for g in host["facts"]["gpus"]]
    assert nvml == proc.stdout.split()


def test_the_probe_reads_this_pythons_pytorch_build(host: dict[str, Any]) -> None:
    import torch

    probe = host["probe"]
    assert probe["torch_version"] == torch.__version__
    assert probe["cuda"] == torch.version.cuda
    assert probe["arch_list"] == torch.cuda.get_arch_list()


def test_the_preflight_passes_a_build_that_runs_here_and_refuses_one_that_does_not(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    said: list[str] = []
    probe = host["probe"]
    rec = preflight(lambda sel, methods: probe, runtime(), None, None, None, said.append)
    gpus = host["facts"]["gpus"]
    check = rec["gpu_check"]
    assert check["status"] == "ok"
    assert [g["compute_capability"] for g in check["gpus"]] == [
        g["compute_capability"] for g in gpus
    ]
    assert all(g["arch_ok"] for g in check["gpus"]), (check, probe["arch_list"])
    assert rec["torch_build"]["arch_list"] == probe["arch_list"]
    # the same GPUs against a build for an architecture none of them has
    major = int(gpus[0]["compute_capability"].split(".")[0])
    other = "sm_50" if major != 5 else "sm_60"
    assert not arch_runs((major, 0), [other])
    with pytest.raises(ServelabError) as err:
        check_gpus(GpuCheck({**probe, "arch_list": [other]}, (), "all"), str)
    assert str(err.value).startswith(
        f"runtime: GPU 0 ({gpus[0]['name']}) has compute capability "
        f"{gpus[0]['compute_capability']}: the venv's PyTorch {probe['torch_version']} "
    )
    assert "\n" not in str(err.value)
