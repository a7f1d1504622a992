"""Known answers for the analysis on hand-built raw trees in both layouts."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from analysis_fixtures import KNEE_SPEC, servelab_point, servelab_tree, vllm_bench_tree

from servelab.analysis.dataset import detect_layout, load_dataset
from servelab.analysis.pipeline import analysis_section, analyze
from servelab.analysis.stats import describe, paired
from servelab.config import load_yaml, validate
from servelab.errors import ServelabError


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_published_knee_is_called_real_with_three_repeats(tmp_path: Path) -> None:
    exp = servelab_tree(tmp_path / "exp", {"a100": KNEE_SPEC})
    opts = analysis_section(
        {
            "claims": [
                "throughput[c=128] > throughput[c=256]",
                "dominated(c=256)",
                "knee(config=a100) == 128",
                "throughput[c=64] > throughput[c=128]",
            ]
        }
    )
    res = analyze(exp, tmp_path / "out", opts, figures=False)
    pair = next(
        r
        for r in rows(tmp_path / "out" / "paired.csv")
        if (r["a"], r["b"], r["metric"]) == ("128", "256", "output_throughput")
    )
    assert pair["agree"] == "3/3"
    assert pair["verdict"] == "a > b"
    assert float(pair["mean_rel_diff_pct"]) == pytest.approx(4.66, abs=0.05)
    assert float(pair["p_value"]) < 0.01
    knee = json.loads((tmp_path / "out" / "knee.json").read_text())
    assert len(knee) == 1 and knee[0]["reason"] == res.knee[0]["reason"]
    assert (
        knee[0]["concurrency"] == 128 and "falls at 256 in every repeat (3/3)" in knee[0]["reason"]
    )
    dom = rows(tmp_path / "out" / "dominance.csv")
    assert [(d["concurrency"], d["dominated_by"]) for d in dom] == [("256", "128")]
    assert float(dom[0]["output_throughput_delta_pct"]) == pytest.approx(-4.46, abs=0.05)
    verdicts = [c["verdict"] for c in json.loads((tmp_path / "out" / "claims.json").read_text())]
    assert verdicts == ["holds", "holds", "holds", "fails"]
    kinds = {(d["kind"], str(d.get("concurrency"))) for d in res.diagnoses}
    assert ("dominated", "256") in kinds and ("past_knee", "[256]") in kinds
    assert not any(k == "serialized" for k, _ in kinds)


def test_summary_statistics(tmp_path: Path) -> None:
    exp = servelab_tree(tmp_path / "exp", {"a100": KNEE_SPEC})
    analyze(exp, tmp_path / "out", figures=False)
    s = {(r["concurrency"], r["metric"]): r for r in rows(tmp_path / "out" / "summary.csv")}
    t = s[("128", "output_throughput")]
    assert t["n"] == "3"
    assert float(t["mean"]) == pytest.approx(4996.33, abs=0.01)
    assert float(t["cv_pct"]) == pytest.approx(0.155, abs=0.001)
    assert float(t["ci95_low"]) < float(t["mean"]) < float(t["ci95_high"])
    assert (float(t["min"]), float(t["max"])) == (4990.0, 5005.0)
    assert float(s[("256", "mean_ttft_ms")]["mean"]) == pytest.approx(746.67, abs=0.01)
    pts = rows(tmp_path / "out" / "points.csv")
    assert len(pts) == 9 and {"mean_ttft_ms", "p99_itl_ms", "output_throughput"} <= set(pts[0])


def test_serialized_and_kv_headroom(tmp_path: Path) -> None:
    flat = {c: [(45.5, 100.0 * c)] * 3 for c in (1, 2, 4, 8)}
    batching = {c: [(45.0 * min(c, 8), 100.0)] * 3 for c in (1, 2, 4, 8)}
    cap = {
        "max_concurrency": 12.9,
        "max_concurrency_tokens_per_request": 32768,
        "kv_cache_tokens": 422707,
        "non_default_args": {"max_num_seqs": 1},
    }
    cap12 = {**cap, "non_default_args": {"max_num_seqs": 12}}
    exp = servelab_tree(
        tmp_path / "exp", {"mns1": flat, "mns12": batching}, {"mns1": cap, "mns12": cap12}
    )
    res = analyze(
        exp,
        tmp_path / "out",
        analysis_section({"claims": ["serialized(config=mns1)", "serialized(config=mns12)"]}),
        figures=False,
    )
    by = {(d["kind"], d["server_config"]): d for d in res.diagnoses}
    assert ("serialized", "mns1") in by and ("serialized", "mns12") not in by
    kv = by[("kv_headroom_unused", "mns1")]
    assert kv["suggested_max_num_seqs"] == 12
    assert "12.9" in kv["suggestion"]
    assert ("kv_headroom_unused", "mns12") not in by
    assert by[("serialized", "mns1")]["evidence"]["max_num_seqs"] == 1
    assert [c["verdict"] for c in res.claims] == ["holds", "fails"]
    assert "serialized" in (tmp_path / "out" / "report.md").read_text()


def test_non_monotonic_valley(tmp_path: Path) -> None:
    v100 = {1: 45.5, 2: 75.5, 3: 47.8, 4: 60.0, 6: 95.0, 8: 156.1}
    spec = {c: [(t * f, 500.0) for f in (0.99, 1.0, 1.01)] for c, t in v100.items()}
    cap = {"non_default_args": {"max_num_seqs": 12, "cudagraph_capture_sizes": [1, 2]}}
    exp = servelab_tree(tmp_path / "exp", {"v100": spec}, {"v100": cap})
    res = analyze(exp, tmp_path / "out", figures=False)
    nm = [d for d in res.diagnoses if d["kind"] == "non_monotonic"]
    assert len(nm) == 1
    assert nm[0]["concurrency"] == 3 and nm[0]["capture_sizes"] == [1, 2]
    assert nm[0]["evidence"]["lower_concurrency"] == 2


def test_one_repeat_has_no_ci_and_is_not_testable(tmp_path: Path) -> None:
    exp = servelab_tree(tmp_path / "exp", {"x": {1: [(100.0, 10.0)], 2: [(150.0, 12.0)]}})
    res = analyze(exp, tmp_path / "out", figures=False)
    s = {(r["concurrency"], r["metric"]): r for r in res.summary}
    t = s[(1, "output_throughput")]
    assert t["n"] == 1 and t["ci95_low"] is None and t["sd"] is None and t["cv_pct"] is None
    p = next(r for r in res.paired if r["metric"] == "output_throughput")
    assert p["verdict"] == "not testable: n = 1" and p["p_value"] is None
    assert "n/a (1 repeat)" in (tmp_path / "out" / "report.md").read_text()


def test_failed_requests_and_point_without_success(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    servelab_point(exp, "x", 1, 2, 100.0, 10.0, n=4, failed=1)
    servelab_point(exp, "x", 1, 4, 100.0, 10.0, n=4, failed=4)
    res = analyze(exp, tmp_path / "out", figures=False)
    pts = {p["concurrency"]: p for p in res.points}
    assert (pts[2]["completed"], pts[2]["failed"]) == (3, 1)
    assert pts[2]["output_throughput"] == pytest.approx(100.0)
    assert pts[4]["completed"] == 0 and pts[4]["mean_ttft_ms"] is None
    line = next(r for r in rows(tmp_path / "out" / "points.csv") if r["concurrency"] == "4")
    assert line["mean_ttft_ms"] == "" and line["failed"] == "4"


def test_identical_values_have_cv_zero() -> None:
    d = describe([7.0, 7.0, 7.0])
    assert d.cv_pct == 0.0 and d.sd == 0.0 and d.ci95_low == d.ci95_high == 7.0
    assert (
        paired([5.0, 5.0], [5.0, 5.0], threshold_pct=2.0, alpha=0.05).verdict == "not significant"
    )


def test_sign_test_could_not_but_log_ratio_t_test_can() -> None:
    r = paired([104.7, 104.6, 104.8], [100.0, 100.1, 99.9], threshold_pct=2.0, alpha=0.05)
    assert r.agree == "3/3" and r.verdict == "a > b" and r.p_value is not None and r.p_value < 0.01
    # real but under 2%
    small = paired([101.0, 100.9, 101.1], [100.0, 100.1, 99.9], threshold_pct=2.0, alpha=0.05)
    assert small.verdict == "not significant"
    noisy = paired([110.0, 95.0, 104.0], [100.0, 100.0, 100.0], threshold_pct=2.0, alpha=0.05)
    assert noisy.verdict == "not significant"


def test_vllm_bench_layout_matches_servelab_layout(tmp_path: Path) -> None:
    root = vllm_bench_tree(
        tmp_path / "qwen-knee",
        KNEE_SPEC,
        with_latencies=False,
        server_log="INFO GPU KV cache size: 401,232 tokens\n"
        "INFO Maximum concurrency for 8,192 tokens per request: 48.98x\n",
    )
    assert detect_layout(root) == "vllm-bench"
    ds = load_dataset(root)
    assert ds.configs() == ["qwen-knee"] and ds.capacity["qwen-knee"]["max_concurrency"] == 48.98
    res = analyze(
        root,
        tmp_path / "out",
        analysis_section({"claims": ["throughput[c=128] > throughput[c=256]"]}),
        figures=False,
    )
    p128 = [p for p in res.points if p["concurrency"] == 128]
    assert [round(p["output_throughput"], 6) for p in p128] == [4990.0, 5005.0, 4994.0]
    assert p128[0]["mean_ttft_ms"] == pytest.approx(420.0)
    # e2el derived from ttft + itls when latencies are missing
    assert p128[0]["mean_e2el_ms"] == pytest.approx(2 * 128 * 50 / 4990.0 * 1000, rel=1e-6)
    assert res.claims[0]["verdict"] == "holds"
    assert res.knee[0]["concurrency"] == 128


def test_slo_capacity_and_goodput(tmp_path: Path) -> None:
    exp = servelab_tree(tmp_path / "exp", {"a100": KNEE_SPEC})
    res = analyze(
        exp, tmp_path / "out", analysis_section({"slo": {"p99_ttft_ms": 500.0}}), figures=False
    )
    slo = json.loads((tmp_path / "out" / "slo.json").read_text())
    assert slo["capacity"]["a100"] == {
        "concurrency": 128,
        "output_throughput": pytest.approx(4996.33, abs=0.01),
    }
    p256 = next(p for p in slo["points"] if p["concurrency"] == 256)
    # 3 x 512 requests, every one over the limit; 3 x 256 within it at c=128
    assert (p256["decision"], p256["requests"], p256["over"]) == ("fails", 1536, 1536)
    assert p256["goodput_req_s"] == 0.0
    p128 = next(p for p in slo["points"] if p["concurrency"] == 128)
    assert p128["decision_text"] == "meets: 0 of 768 over (upper 0.39%, allowed 1%)"
    p64 = next(p for p in slo["points"] if p["concurrency"] == 64)
    assert p64["goodput_req_s"] == pytest.approx(
        describe([4240 / 100, 4255 / 100, 4272 / 100]).mean
    )
    assert res.slo["capacity"]["a100"]["concurrency"] == 128


def test_an_unknown_slo_is_a_config_error(repo: Path) -> None:
    raw = load_yaml(repo / "config" / "config.yaml")
    raw["analysis"]["slo"] = {"p50_ttft_ms": 1.0}
    with pytest.raises(ServelabError, match=r"analysis\.slo: .*p50_ttft_ms") as err:
        validate(raw, "config.yaml")
    assert "p99_ttft_ms" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("claim", "msg"),
    [
        ("throughput c=1 > 2", "is not a claim"),
        ("throughput[c=3] > throughput[c=128]", "concurrency 3 was not measured"),
        ("throughput[c=64] > mean_ttft_ms[c=128]", "compare one metric"),
        ("throughput[q=64] > throughput[c=128]", "are c=N and config=NAME"),
        ("dominated(config=nope, c=64)", "config 'nope' was not measured"),
    ],
)
def test_malformed_claims_are_clear_errors(tmp_path: Path, claim: str, msg: str) -> None:
    exp = servelab_tree(tmp_path / "exp", {"a100": KNEE_SPEC})
    with pytest.raises(ServelabError, match=msg) as err:
        analyze(exp, tmp_path / "out", analysis_section({"claims": [claim]}), figures=False)
    assert str(err.value).startswith("analysis.claims: ")


def test_outputs_are_byte_identical_across_runs(tmp_path: Path) -> None:
    exp = servelab_tree(
        tmp_path / "exp", {"a100": KNEE_SPEC, "b": {64: [(100.0, 5.0)] * 3, 128: [(90.0, 9.0)] * 3}}
    )
    opts = analysis_section(
        {"slo": {"p99_ttft_ms": 500.0}, "claims": ["dominated(config=a100, c=256)"]}
    )
    analyze(exp, tmp_path / "one", opts)
    analyze(exp, tmp_path / "two", opts)
    files = sorted(
        p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file()
    )
    assert len([f for f in files if f.suffix in (".svg", ".png")]) == 10
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    svg = (tmp_path / "one" / "figures" / "throughput_vs_concurrency.svg").read_text()
    assert "<dc:date>" not in svg and "Matplotlib v" not in svg


def test_the_analysis_names_every_file_it_writes(tmp_path: Path) -> None:
    """The typed result says which file each table goes to: the rules' ANALYSIS_TABLES and
    validity.json always, the others only where they apply (and only those are written)."""
    from servelab.store.paths import ANALYSIS_TABLES, VALIDITY_TABLE

    exp = servelab_tree(tmp_path / "exp", {"a100": KNEE_SPEC})
    res = analyze(exp, tmp_path / "out", analysis_section({"slo": {"p99_ttft_ms": 500.0}}), False)
    always = {*res.csv_tables(), *res.json_tables()}
    assert always == {*ANALYSIS_TABLES, VALIDITY_TABLE}
    written = {p.name for p in (tmp_path / "out").glob("*.*") if p.suffix in (".csv", ".json")}
    applies = {name for name, doc in res.only_where().items() if doc is not None}
    assert applies == {"slo.json"} and written == always | applies
    assert res.rounds is None and res.same_host is None and res.turns is None


def test_unknown_layout_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ServelabError, match="neither servelab raw data"):
        load_dataset(tmp_path)


def test_serialized_over_the_widest_flat_span(tmp_path: Path) -> None:
    """A slow first level (client round trips at concurrency 1) does not hide a flat 2..16."""
    spec = {1: [(40.0, 50.0)] * 3, **{c: [(45.5, 100.0 * c)] * 3 for c in (2, 4, 8, 16)}}
    exp = servelab_tree(tmp_path / "exp", {"mns1": spec})
    res = analyze(exp, tmp_path / "out", figures=False)
    ser = [d for d in res.diagnoses if d["kind"] == "serialized"]
    assert len(ser) == 1 and ser[0]["evidence"]["concurrency_span"] == [2, 16]
    assert ser[0]["evidence"]["throughput_spread_pct"] < 1.0
