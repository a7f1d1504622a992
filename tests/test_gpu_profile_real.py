"""The profile analysis on a real GPU trace made with PyTorch alone (no vLLM, no Nsight
Systems): a toy model whose "layers" run FlashAttention-2 through
torch.nn.functional.scaled_dot_product_attention, traced by torch.profiler (CPU and CUDA
activities, as vLLM's torch profiler runs) and read by `servelab profile analyze`.

What it checks on real kernel names and grids: FlashAttention-2's forward kernel
(`pytorch_flash::flash_fwd_kernel<...>`, PyTorch's copy of flash_api.cpp's templates) runs as
two instantiations when forwards alternate causal and non-causal attention, and the analysis
keeps both as one kernel family (settings.attention_instantiations), so every forward is
grouped; the population is read from the grid (FA2: grid y is the batch); the CPU op that
launches the kernel is not taken for the kernel.

Needs PyTorch with CUDA and a GPU that runs FlashAttention-2 (sm80 or newer); skipped elsewhere.

    SERVELAB_SKIP_E2E=1 python -m pytest tests/test_gpu_profile_real.py -m gpu -v -rs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servelab.profile.torchtrace import TorchTrace
from servelab.profile.trace_analysis import TraceOptions, analyze_trace
from servelab.profile.windows import parse_windows

pytestmark = pytest.mark.gpu

LAYERS = 4
HEADS = 16
SEQ = 1024  # 8 blocks of 128 rows: batch x heads x blocks fills the SMs, no split-KV
HEAD_DIM = 64
BATCHES = [2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 2]  # fill, steady, drain


def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("FlashAttention-2 needs sm80 or newer")
    return torch


def make_trace(folder: Path) -> Path:
    torch = _torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    dev = torch.device("cuda:0")
    w = torch.randn(HEAD_DIM, HEAD_DIM, device=dev, dtype=torch.bfloat16)

    def forward(batch: int, causal: bool) -> None:
        x = torch.randn(batch, HEADS, SEQ, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        for _ in range(LAYERS):
            x = sdpa(x, x, x, is_causal=causal) @ w

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for b in (1, 2):  # warm-up, outside the trace
            forward(b, True)
            forward(b, False)
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for i, b in enumerate(BATCHES):
                forward(b, causal=i % 2 == 0)
            torch.cuda.synchronize()
    path = folder / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_flash_attention_instantiations_on_a_real_trace(tmp_path: Path) -> None:
    path = make_trace(tmp_path)
    trace = TorchTrace([path])
    assert trace.kind == "gpu"
    kernels = [o for o in trace.ops if o.grid is not None]
    assert kernels, "the trace holds no kernel with a grid"
    lo = min(o.start for o in kernels) - 1
    hi = max(o.end for o in kernels) + 1
    window = {
        "label": "w",
        "start_ns": lo,
        "end_ns": hi,
        "clock": trace.clock(),
        "output_tokens": sum(BATCHES),
    }
    res = analyze_trace([path], parse_windows({"windows": [window]}, "w"), TraceOptions(LAYERS))
    prof = res.profile
    settings = prof["settings"]
    assert settings["attention_family"] == "flash_fwd_kernel", settings["attention_kernel"]
    names = [i["name"] for i in settings["attention_instantiations"]]
    assert len(names) == 2, names  # causal and non-causal: two template instantiations
    assert all("flash_fwd_kernel<" in n for n in names)
    assert settings["population_dim"] == "y"
    w = prof["windows"]["w"]
    assert w["forwards"]["count"] == len(BATCHES)
    assert w["forwards"]["violations"] == 0
    assert [f.population for _, f in res.forwards["w"]] == BATCHES
    assert w["steady"] is not None and w["steady"]["population_mean"] == 4.0
    assert w["families"]["attention"]["calls"] >= LAYERS * len(BATCHES)
