from __future__ import annotations

import itertools
from collections.abc import Callable

from servelab.hostfacts import canary


def fake_timer(step: float) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: next(ticks) * step


def test_fields_and_units() -> None:
    result = canary.measure_cpu(iterations=1000, buffer_mib=1, repeats=3)
    assert result.compute.unit == "s" and result.bandwidth.unit == "GB/s"
    assert result.compute.repeats == 3 and result.bandwidth.repeats == 3
    assert result.compute.low <= result.compute.median <= result.compute.high
    assert result.bandwidth.median > 0
    data = result.to_json()
    assert set(data) == {"compute", "bandwidth", "checksum", "iterations", "buffer_mib"}


def test_work_is_deterministic() -> None:
    first = canary.measure_cpu(iterations=2000, buffer_mib=1, repeats=2)
    second = canary.measure_cpu(iterations=2000, buffer_mib=1, repeats=2)
    assert first.checksum == second.checksum == canary.compute_work(2000)
    assert canary.compute_work(2000) != canary.compute_work(2001)


def test_drift_steady_back_to_back() -> None:
    before = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.01))
    after = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.01))
    result = canary.drift(before, after)
    assert result.verdict == "steady"
    assert result.compute.change == 0.0 and result.compute.threshold == canary.DRIFT_FLOOR


def test_drift_moved_on_30_percent_slowdown() -> None:
    before = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.01))
    after = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.013))
    result = canary.drift(before, after)
    assert result.verdict == "moved"
    assert abs(result.compute.change - 0.3) < 1e-9
    assert abs(result.bandwidth.change - 0.3) < 1e-9


def test_gpu_part_is_measured_or_absent_with_reason() -> None:
    """Where PyTorch sees a CUDA device the GPU part is timed; elsewhere it is absent and says
    why, with nothing timed."""
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    result = canary.measure_gpu()
    assert result.present is cuda
    if cuda:
        assert result.reason == ""
        assert result.matmul is not None and result.matmul.median > 0
        assert result.copy is not None and result.copy.median > 0
    else:
        assert result.reason and result.matmul is None and result.copy is None
