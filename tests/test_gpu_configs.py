"""The GPU experiments in config/experiments/ and the image recipes in containers/: pinned,
consistent with each other, and dry-runnable on a host without docker, a GPU or a network."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_env import snakemake_env

from servelab.config import load, validate
from servelab.env.container import parse_image
from servelab.errors import ServelabError

REPO = Path(__file__).resolve().parents[1]
A100 = REPO / "config" / "experiments" / "a100-qwen2.5-3b-knee.yaml"
V100 = REPO / "config" / "experiments" / "v100-awq-max-num-seqs.yaml"
BASE = (
    "vllm/vllm-openai:v0.27.1-x86_64-cu129"
    "@sha256:6666717cd1cadf9adfff8abec9c3f2eca6e27e742de06fe7d7f129fa3d647732"
)
NSYS_DIR = re.compile(r"/opt/nvidia/nsight-systems-cli/(\d{4}\.\d+\.\d+)")


def test_a100_knee_config_pins_what_a_clean_room_run_must_match() -> None:
    cfg = load(A100).to_dict()
    assert cfg["experiment"] == "a100-qwen2.5-3b-knee"
    model = cfg["model"]
    assert (model["source"], model["repo"], model["revision"]) == (
        "hf",
        "Qwen/Qwen2.5-3B-Instruct",
        "aa8e72537993ba99e69dfaafa59ed015b17504d1",
    )
    rt = cfg["runtime"]
    assert (rt["kind"], rt["device"], rt["gpus"]) == ("docker", "gpu", 1)
    assert parse_image(rt["image"], "docker").digest == parse_image(BASE, "docker").digest
    args = cfg["server"]["args"]
    assert args == {
        "dtype": "bfloat16",
        "max-model-len": 8192,
        "gpu-memory-utilization": 0.50,
        "enable-prefix-caching": False,
        "enable-chunked-prefill": True,
        # vLLM's choice by GPU, pinned to the A100's: an H100 would choose 1024 and 8192
        "max-num-seqs": 256,
        "max-num-batched-tokens": 2048,
        "tensor-parallel-size": 1,
        "seed": 0,
    }
    wl = cfg["workload"]
    assert (wl["seed"], wl["input_tokens"], wl["output_tokens"], wl["waves"]) == (0, 512, 128, 8)
    assert [c * wl["waves"] for c in cfg["sweep"]["concurrency"]] == [512, 1024, 2048]
    sweep = cfg["sweep"]
    assert (sweep["concurrency"], sweep["repeats"], sweep["order"]) == ([64, 128, 256], 3, "latin")
    assert cfg["profile"]["concurrency"] == [64, 128, 256] and cfg["profile"]["tool"] == "nsys"
    assert cfg["analysis"]["claims"] == [
        "throughput[c=128] > throughput[c=256]",
        "dominated(c=256)",
    ]
    # what vLLM would otherwise take from the quickstart (num-gpu-blocks-override, KV space)
    assert cfg["runtime"]["env"] == {}


def test_v100_config_is_refused_until_the_model_is_pinned() -> None:
    with pytest.raises(ServelabError) as err:
        load(V100)
    msg = str(err.value)
    assert msg == (
        f"{V100}: model.repo and model.revision are not pinned: set model.repo to an AWQ "
        "model repository (e.g. Qwen/Qwen2.5-7B-Instruct-AWQ) and model.revision to its "
        "40-hex commit (huggingface.co/REPO/commits/main)"
    )
    raw = yaml.safe_load(V100.read_text())
    raw["model"].update(repo="Qwen/Qwen2.5-7B-Instruct-AWQ", revision="0" * 40)
    cfg = validate(raw, str(V100)).to_dict()
    assert [c["name"] for c in cfg["server"]["configs"]] == [
        "max-num-seqs-1",
        "max-num-seqs-2",
        "max-num-seqs-12",
    ]
    assert cfg["sweep"]["concurrency"] == [1, 2, 3, 4, 6, 8]
    args = cfg["server"]["args"]
    assert (args["tensor-parallel-size"], cfg["runtime"]["gpus"]) == (2, 2)
    assert (args["quantization"], args["max-model-len"]) == ("awq", 32768)
    assert "serialized(config=max-num-seqs-1)" in cfg["analysis"]["claims"]
    raw["model"]["revision"] = "main"
    with pytest.raises(ServelabError, match="model.revision: 'main' is not a commit"):
        validate(raw, str(V100))


def test_recipes_extend_the_same_base_by_digest() -> None:
    docker = (REPO / "containers" / "Dockerfile").read_text()
    apptainer = (REPO / "containers" / "servelab-vllm.def").read_text()
    froms = [line.split(None, 1)[1] for line in docker.splitlines() if line.startswith("FROM ")]
    assert froms == [BASE]
    assert re.search(r"^Bootstrap:\s*docker\s*$", apptainer, re.M)
    assert re.findall(r"^From:\s*(\S+)\s*$", apptainer, re.M) == [BASE]
    # the same Nsight Systems in both, and where the GPU experiments look for it
    docker_nsys = re.findall(r"^ARG NSYS_VERSION=(\S+)$", docker, re.M)
    apptainer_nsys = re.findall(r"^\s*NSYS_VERSION=(\S+)$", apptainer, re.M)
    assert docker_nsys == apptainer_nsys and len(docker_nsys) == 1
    for path in (A100, V100):
        raw = yaml.safe_load(path.read_text())
        assert raw["runtime"]["image"] == BASE
        assert NSYS_DIR.search(raw["profile"]["nsys"])[1] == docker_nsys[0]  # type: ignore[index]
        # the host's Nsight Systems is found and mounted by the profiling pass alone: a
        # runtime mount would stop the runtime stage on a host without that very folder
        assert raw["runtime"]["mounts"] == []
        assert raw["profile"]["required"] is False


def dry_run(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """snakemake -n with no engine, no GPU and no hub: `docker`, `podman`, `apptainer` and
    `nvidia-smi` on PATH record that they were called and fail; the hub is unreachable."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("docker", "podman", "apptainer", "nvidia-smi"):
        tool = bindir / name
        tool.write_text(f'#!/bin/sh\necho "$0 $*" >> {tmp_path}/called\nexit 99\n')
        tool.chmod(0o755)
    env = snakemake_env(
        {
            **os.environ,
            "PATH": f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "HF_ENDPOINT": "http://127.0.0.1:9",
        }
    )
    return subprocess.run(
        ["snakemake", "-n", "--cores", "1", "--nolock", "--configfile", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_a100_config_dry_runs_without_docker_gpu_or_network(tmp_path: Path) -> None:
    proc = dry_run(A100, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for rule in ("rule model:", "rule runtime:", "rule sweep:", "rule profile:", "rule bundle:"):
        assert rule in proc.stdout, rule
    assert "results/a100-qwen2.5-3b-knee/raw/tp1-bf16/run.json" in proc.stdout
    assert not (tmp_path / "called").exists(), (tmp_path / "called").read_text()


def test_v100_dry_run_stops_with_one_pinning_line(tmp_path: Path) -> None:
    proc = dry_run(V100, tmp_path)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "config error" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].endswith(
        "model.repo and model.revision are not pinned: set model.repo to an AWQ model "
        "repository (e.g. Qwen/Qwen2.5-7B-Instruct-AWQ) and model.revision to its 40-hex "
        "commit (huggingface.co/REPO/commits/main)"
    )
    assert not (tmp_path / "called").exists()


def test_v100_config_dry_runs_once_the_model_is_pinned(tmp_path: Path) -> None:
    """Pinning the two placeholders is all the V100 study needs: then it dry-runs, one sweep
    and one profiling job per --max-num-seqs configuration."""
    text = V100.read_text()
    text = re.sub(r'repo: "<set:[^"]*"', "repo: Qwen/Qwen2.5-7B-Instruct-AWQ", text)
    text = re.sub(r'revision: "<set:[^"]*"', f"revision: {'a' * 40}", text)
    pinned = tmp_path / "v100-awq-max-num-seqs.yaml"
    pinned.write_text(text)
    proc = dry_run(pinned, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for sc in ("max-num-seqs-1", "max-num-seqs-2", "max-num-seqs-12"):
        assert f"results/v100-awq-max-num-seqs/raw/{sc}/run.json" in proc.stdout, sc
    assert not (tmp_path / "called").exists()


def test_an_experiment_file_does_not_inherit_the_quickstart(tmp_path: Path) -> None:
    """--configfile replaces config/config.yaml: its server.args (max-model-len 1024,
    num-gpu-blocks-override 68) must not leak into another experiment."""
    raw = {
        "experiment": "no-inherit",
        "results_dir": str(tmp_path / "results"),
        "model": {"source": "tiny"},
        "runtime": {"kind": "venv"},
        "server": {"configs": [{"name": "a"}]},
        "workload": {"input_tokens": 2000, "output_tokens": 128},  # > 1024 tokens
        "sweep": {"concurrency": [1]},
        "profile": {"enabled": False},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = dry_run(path, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
