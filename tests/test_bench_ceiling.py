"""Figure 3's rules (benchmarks/bench_ceiling.py) on hand-built level results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_ceiling as bc  # noqa: E402

STEPS = [4000, 2000, 1000, 500, 0]


def run(who: str, step: int, rate: float, p99: float, ttft: float, **kw: Any) -> dict[str, Any]:
    m = {
        "client": who, "step_us": step, "tokens": 10_000, "requests": 128,
        "requests_expected": 128, "bad_requests": 0, "rate_tok_s": rate, "lag_p50_ms": p99 / 2,
        "lag_p99_ms": p99, "lag_max_ms": p99 * 2, "ttft_err_mean_ms": ttft,
        "ttft_err_p99_abs_ms": abs(ttft) * 1.5, "client_cpu_s": 1.0,
    }  # fmt: skip
    m.update(kw)
    return m


def avx2_host(vllm_p99: list[float] | None = None) -> list[dict[str, Any]]:
    """Both clients 5.8-7 ms p99 at every level; TTFT error servelab 4-7 ms, vLLM 50-660 ms."""
    sl_rate = [15_900, 31_800, 63_000, 110_000, 120_000]
    sl_p99 = [5.8, 6.1, 6.4, 6.8, 7.0]
    sl_ttft = [4.0, 4.5, -5.0, 6.0, 7.0]
    vl_rate = [15_500, 30_500, 55_000, 60_000, 41_000]
    vl_p99 = vllm_p99 or [5.9, 6.0, 6.5, 6.9, 7.0]
    vl_ttft = [50.0, 90.0, 200.0, 400.0, 660.0]
    levels = []
    for i, s in enumerate(STEPS):
        for d in (0.0, 0.1):  # two runs: the second a little slower, its lag a little lower
            levels.append(run("servelab", s, sl_rate[i] - d * 100, sl_p99[i] - d, sl_ttft[i]))
            levels.append(run("vllm", s, vl_rate[i] - d * 100, vl_p99[i] - d, vl_ttft[i] - d))
    return levels


# README, figure 3, run A: (rate, p99 lag) of both runs per step
QUIET_A = {
    "servelab": {
        4000: [(15_980, 0.43), (15_977, 0.49)], 2000: [(31_913, 0.49), (31_910, 0.60)],
        1000: [(63_900, 0.41), (63_878, 0.56)], 700: [(91_163, 0.94), (90_245, 0.28)],
        600: [(105_880, 0.51), (106_287, 0.65)], 500: [(127_074, 1.77), (126_406, 2.67)],
        420: [(145_580, 4.12), (150_212, 1.84)], 350: [(179_207, 1.32), (180_069, 1.37)],
        300: [(184_064, 11.36), (182_957, 3.25)], 250: [(181_250, 2.29), (179_786, 1.63)],
        0: [(218_908, 396.0), (172_659, 349.0)],
    },
    "vllm": {
        4000: [(15_561, 4.32), (15_553, 1.94)], 2000: [(30_967, 6.26), (31_318, 2.31)],
        1000: [(61_247, 3.06), (61_786, 5.30)], 700: [(86_692, 23.35), (88_191, 3.68)],
        600: [(102_402, 4.90), (102_303, 7.53)], 500: [(120_426, 25.65), (119_399, 15.80)],
        420: [(137_425, 72.0), (127_396, 284.0)], 350: [(154_141, 163.0), (148_651, 193.0)],
        300: [(144_228, 355.0), (119_114, 698.0)], 250: [(125_613, 843.0), (132_003, 701.0)],
        0: [(126_683, 959.0), (126_918, 949.0)],
    },
}  # fmt: skip


def quiet_host() -> list[dict[str, Any]]:
    return [
        run(who, step, rate, p99, 1.0)
        for who, per in QUIET_A.items()
        for step, runs in per.items()
        for rate, p99 in runs
    ]


def figure(levels: list[dict[str, Any]], lag: float = 5.0, ttft: float = 10.0) -> bc.Figure:
    return bc.figures(levels, lag, ttft)


def line(lines: list[str], prefix: str) -> str:
    [found] = [ln for ln in lines if ln.startswith(prefix)]
    return found


def test_avx2_host_gives_a_finite_ratio_by_the_robust_rules() -> None:
    fig = figure(avx2_host())
    c = fig.ceilings
    assert c["fixed"].rate == {"servelab": None, "vllm": None}
    assert "lowest p99 lag 5.80 ms at 4 ms > 5.00 ms" == c["fixed"].missed["servelab"]
    # floor: the lower worst-run p99 at 4 ms (servelab 5.8) + 5 ms; every level passes
    assert c["floor"].rule.bound_ms == pytest.approx(10.8)
    assert c["floor"].rate == {"servelab": 119_990, "vllm": 59_990}
    assert c["floor"].ratio == pytest.approx(119_990 / 59_990)
    assert fig.headline == "floor"
    # TTFT error: servelab within 10 ms everywhere, vLLM's client nowhere
    assert c["ttft"].rate["servelab"] == 119_990
    assert c["ttft"].rate["vllm"] is None
    assert c["ttft"].ratio is None
    assert c["ttft"].missed["vllm"] == "lowest TTFT error 50.00 ms at 4 ms > 10.00 ms"

    lines = bc.report_lines(fig, 64)
    f3 = line(lines, "FIGURE 3 ")
    assert "ratio 2.00 (goal >= 2.00)" in f3
    assert "host floor 5.80 ms at 4 ms + 5 ms" in f3
    assert "ratio no level" in f3  # the fixed 5 ms rule
    assert "servelab no level (lowest p99 lag 5.80 ms at 4 ms > 5.00 ms)" in f3
    assert "floor 5.80 ms is above the fixed bound: a slow or busy host" in f3
    f3b = line(lines, "FIGURE 3b ")
    assert "at step 0, the fastest level both completed" in f3b
    assert "servelab 7.00 ms, vllm bench serve 660.00 ms" in f3b
    assert "vllm bench serve no level (lowest TTFT error 50.00 ms" in f3b
    assert not any("inf" in ln for ln in lines)


def test_slow_anchor_falls_back_to_the_25ms_rule_and_says_so() -> None:
    # the numbers: vLLM's client 10-600 ms over 5 ms, servelab 0.8-2 ms over
    fig = figure(avx2_host(vllm_p99=[15.0, 20.0, 60.0, 300.0, 605.0]))
    c = fig.ceilings
    assert c["floor"].rate["vllm"] is None
    assert fig.headline == "fixed_wide"
    assert c["fixed_wide"].rate == {"servelab": 119_990, "vllm": 30_490}
    f3 = line(bc.report_lines(fig, 64), "FIGURE 3 ")
    assert "p99 lag <= 25 ms: fixed" in f3
    assert f"ratio {119_990 / 30_490:.2f} (goal" in f3
    assert "by the host-floor rule (p99 lag <= 10.80 ms): vllm bench serve no level" in f3


def test_quiet_host_keeps_the_old_fixed_rule_ceiling() -> None:
    fig = figure(quiet_host())
    c = fig.ceilings
    assert c["fixed"].rate == {"servelab": 179_786, "vllm": 15_553}
    assert c["fixed"].step_us == {"servelab": 250, "vllm": 4000}
    assert f"{c['fixed'].ratio:.2f}" == "11.56"
    assert c["fixed_wide"].rate == {"servelab": 182_957, "vllm": 102_303}
    # floor 0.49 ms (servelab's worse run at 4 ms): 5.49 ms lets vLLM's 1 ms level through
    assert c["floor"].rule.bound_ms == pytest.approx(5.49)
    assert c["floor"].rate == {"servelab": 179_786, "vllm": 61_247}
    f3 = line(bc.report_lines(fig, 64), "FIGURE 3 ")
    assert "fixed rule p99 lag <= 5 ms: servelab 179,786 tok/s" in f3
    assert "slow or busy" not in f3


def test_failed_requests_never_pass_a_level() -> None:
    levels = quiet_host()
    for m in levels:
        if m["client"] == "servelab" and m["step_us"] == 250 and m["rate_tok_s"] == 179_786:
            m["bad_requests"] = 1
        if m["client"] == "servelab" and m["step_us"] == 350 and m["rate_tok_s"] == 180_069:
            m["requests"] = 127  # a request missing from the client's records
    c = figure(levels).ceilings
    assert c["fixed"].rate["servelab"] == 145_580  # the 0.42 ms level
    assert c["fixed"].step_us["servelab"] == 420
    for m in levels:
        if m["client"] == "vllm":
            m["bad_requests"] = 3
    levels.append({"client": "vllm", "step_us": 0, "tokens": 0, "requests": 128,
                   "requests_expected": 128, "bad_requests": 128, "client_cpu_s": 1.0})  # fmt: skip
    fig = figure(levels)
    assert all(fig.ceilings[k].rate["vllm"] is None for k in fig.ceilings)
    assert fig.ceilings["ttft"].missed["vllm"] == "failed requests at every level"
    lines = bc.report_lines(fig, 64)
    assert "ratio no level" in line(lines, "FIGURE 3 ")
    assert not any("inf" in ln for ln in lines)  # a run with no chunks prints "-"


def test_report_only_reprints_from_the_saved_file(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    out.write_text(json.dumps({"config": {"concurrency": "64"}, "levels": avx2_host()}))
    cmd = [sys.executable, str(BENCH / "bench_ceiling.py"), "--report-only", "--out", str(out)]
    first = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    saved = out.read_text()
    again = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert first == again and out.read_text() == saved  # deterministic, and nothing measured
    figs = [ln for ln in first.splitlines() if ln.startswith("FIGURE")]  # as run_all.py reads
    assert [f.split(" ")[1] for f in figs] == ["3", "3b"]
    res = json.loads(saved)
    assert res["headline"] == "floor"
    assert res["ceilings"]["ttft"]["rate_tok_s"] == {"servelab": 119_990, "vllm": None}
    assert list(res) == sorted(res)
