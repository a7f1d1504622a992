"""Diagnoses on single-run data and their evidence levels; the CUDA graph capture sizes
against a throughput dip. Known answers on trees built to the published V100 study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from analysis_fixtures import (
    V100_MNS1,
    V100_MNS12,
    servelab_tree,
    v100_server_log,
    vllm_bench_tree,
)

from servelab.analysis.pipeline import analyze
from servelab.cli import main
from servelab.evidence.schemas import load_schema
from servelab.launch.serverlog import parse_capacity

UNTESTED = "1 repeat: not tested"


def _by_kind(res: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [d for d in res.diagnoses if d["kind"] == kind]


def _schema_valid(out: Path) -> None:
    jsonschema.Draft202012Validator(load_schema("diagnoses")).validate(
        json.loads((out / "diagnoses.json").read_text())
    )
    jsonschema.Draft202012Validator(load_schema("knee")).validate(
        json.loads((out / "knee.json").read_text())
    )


def test_seed000_valley_on_one_repeat_is_reported_untested_with_capture_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = vllm_bench_tree(
        tmp_path / "v100-mns12", V100_MNS12, server_log=v100_server_log(12, [1, 2])
    )
    out = tmp_path / "out"
    assert main(["analyze", str(root), "--out", str(out), "--no-figures"]) == 0
    printed = capsys.readouterr().out.splitlines()
    diags = json.loads((out / "diagnoses.json").read_text())
    nm = [d for d in diags if d["kind"] == "non_monotonic"]
    assert len(nm) == 1
    dip = nm[0]
    assert dip["concurrency"] == 3
    assert dip["evidence_level"] == {
        "repeats": 1,
        "tested": False,
        "p_value": None,
        "label": UNTESTED,
    }
    ev = dip["evidence"]
    assert (ev["lower_concurrency"], ev["passes_lower_at"]) == (2, 6)
    assert ev["drop_pct"] == pytest.approx(100 * (1 - 47.8 / 75.53), abs=0.05)
    assert dip["capture_sizes"] == [1, 2]
    assert dip["capture_sizes_source"] == "compilation_config"
    assert (dip["batch_size"], dip["batch_size_source"]) == (3, "concurrency")
    assert dip["outside_capture_sizes"] is True
    assert "outside the captured CUDA graph sizes [1, 2]" in dip["capture_explanation"]
    assert "concurrency 2 (batch 2) is inside them" in dip["capture_explanation"]
    line = next(x for x in printed if "non_monotonic" in x)
    assert line.startswith(f"  non_monotonic: v100-mns12 c=3 ({UNTESTED}); batch size 3")
    # every dominated point says it was compared on one repeat, untested
    dom = [d for d in diags if d["kind"] == "dominated"]
    assert {d["concurrency"] for d in dom} == {3, 4}
    assert all(d["evidence_level"]["label"] == UNTESTED for d in dom)
    assert [x for x in printed if x.startswith("  dominated")] == [
        f"  dominated: v100-mns12 c={c} by c=2 ({UNTESTED})" for c in (3, 4)
    ]
    # --max-num-seqs 12 already uses the 12.90x headroom
    assert not [d for d in diags if d["kind"] == "kv_headroom_unused"]
    report = (out / "report.md").read_text()
    assert f"(concurrency 3), *{UNTESTED}*: throughput dips 37% below concurrency 2" in report
    _schema_valid(out)


def test_seed000_serialized_on_one_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = vllm_bench_tree(tmp_path / "v100-mns1", V100_MNS1, server_log=v100_server_log(1, [1, 2]))
    out = tmp_path / "out"
    assert main(["analyze", str(root), "--out", str(out), "--no-figures"]) == 0
    printed = capsys.readouterr().out
    assert f"  serialized: v100-mns1 ({UNTESTED})" in printed
    res = json.loads((out / "diagnoses.json").read_text())
    ser = [d for d in res if d["kind"] == "serialized"]
    assert len(ser) == 1 and ser[0]["evidence"]["max_num_seqs"] == 1
    assert ser[0]["evidence"]["concurrency_span"] == [1, 8]
    assert ser[0]["evidence_level"]["tested"] is False
    kv = next(d for d in res if d["kind"] == "kv_headroom_unused")
    assert kv["suggested_max_num_seqs"] == 12
    assert kv["evidence_level"]["repeats"] is None and kv["evidence_level"]["tested"] is False
    # flat throughput: no dip
    assert not [d for d in res if d["kind"] == "non_monotonic"]
    knee = json.loads((out / "knee.json").read_text())
    assert knee[0]["concurrency"] == 1 and knee[0]["evidence_level"]["label"] == UNTESTED
    past = next(d for d in res if d["kind"] == "past_knee")
    assert past["evidence_level"]["label"] == UNTESTED
    _schema_valid(out)


def test_repeated_valley_keeps_the_test_and_names_it(tmp_path: Path) -> None:
    spec = {c: [(v[0][0] * f, v[0][1]) for f in (0.99, 1.0, 1.01)] for c, v in V100_MNS12.items()}
    cap = parse_capacity(v100_server_log(12, [1, 2]))
    exp = servelab_tree(tmp_path / "exp", {"v100": spec}, {"v100": cap})
    res = analyze(exp, tmp_path / "out", figures=False)
    dip = _by_kind(res, "non_monotonic")[0]
    level = dip["evidence_level"]
    assert level["repeats"] == 3 and level["tested"] is True
    assert level["p_value"] is not None and level["p_value"] < 0.05
    assert level["label"].startswith("3 repeats: paired t-test p = ")
    assert level["label"].endswith("(3/3 agree)")
    assert dip["outside_capture_sizes"] is True
    dom = _by_kind(res, "dominated")
    assert dom and all(d["evidence_level"]["label"] == "3 repeats: not tested" for d in dom)
    _schema_valid(tmp_path / "out")


def test_repeated_dip_the_test_does_not_call_real_is_not_reported(tmp_path: Path) -> None:
    """With repeats the paired test still decides: a dip the repeats disagree on stays out."""
    spec = {
        1: [(45.0, 500.0), (46.0, 500.0), (45.5, 500.0)],
        2: [(80.0, 500.0), (50.0, 500.0), (75.0, 500.0)],
        3: [(48.0, 500.0), (79.0, 500.0), (47.0, 500.0)],
        4: [(90.0, 500.0), (91.0, 500.0), (92.0, 500.0)],
    }
    exp = servelab_tree(tmp_path / "exp", {"x": spec})
    res = analyze(exp, tmp_path / "out", figures=False)
    assert not _by_kind(res, "non_monotonic")
    # the same means on one repeat are reported, untested
    one = {c: [(sum(t for t, _ in v) / 3, 500.0)] for c, v in spec.items()}
    exp1 = servelab_tree(tmp_path / "exp1", {"x": one})
    res1 = analyze(exp1, tmp_path / "out1", figures=False)
    assert [d["evidence_level"]["label"] for d in _by_kind(res1, "non_monotonic")] == [UNTESTED]


def test_knee_that_falls_carries_its_test(tmp_path: Path) -> None:
    from analysis_fixtures import KNEE_SPEC

    exp = servelab_tree(tmp_path / "exp", {"a100": KNEE_SPEC})
    res = analyze(exp, tmp_path / "out", figures=False)
    level = res.knee[0]["evidence_level"]
    assert level["tested"] is True and level["repeats"] == 3 and level["p_value"] < 0.01
    one = {c: v[:1] for c, v in KNEE_SPEC.items()}
    exp1 = servelab_tree(tmp_path / "exp1", {"a100": one})
    res1 = analyze(exp1, tmp_path / "out1", figures=False)
    k = res1.knee[0]
    assert k["concurrency"] == 128 and k["reason"].endswith("falls at 256 (1 repeat)")
    assert k["evidence_level"]["label"] == UNTESTED
    past = _by_kind(res1, "past_knee")[0]
    assert past["evidence_level"]["label"] == UNTESTED


@pytest.mark.parametrize(
    ("capacity", "outside", "words"),
    [
        ({"cudagraph_capture_sizes": [1, 2, 4]}, False, "padded up to 4"),
        ({"cudagraph_capture_sizes": [1, 2, 3, 4]}, False, "is a captured CUDA graph size"),
        (
            {"cudagraph_capture_sizes": [], "cudagraph_mode": "NONE"},
            None,
            "captured no CUDA graphs",
        ),
        ({}, None, "capture sizes are unknown"),
        # a capacity.json written before the sizes were recorded: the arguments asked for
        (
            {"non_default_args": {"compilation_config": {"cudagraph_capture_sizes": [2, 1]}}},
            True,
            "[1, 2]",
        ),
    ],
)
def test_dip_against_capture_sizes(
    tmp_path: Path, capacity: dict[str, Any], outside: bool | None, words: str
) -> None:
    exp = servelab_tree(tmp_path / "exp", {"v100": V100_MNS12}, {"v100": capacity})
    res = analyze(exp, tmp_path / "out", figures=False)
    dip = _by_kind(res, "non_monotonic")[0]
    assert dip["outside_capture_sizes"] is outside
    assert words in dip["capture_explanation"]
    assert words in dip["suggestion"]


def test_batch_capped_by_max_num_seqs(tmp_path: Path) -> None:
    """Above --max-num-seqs the batch is the cap, not the concurrency."""
    spec = {1: [(45.0, 1.0)], 2: [(80.0, 1.0)], 4: [(50.0, 1.0)], 8: [(120.0, 1.0)]}
    cap = {"non_default_args": {"max_num_seqs": 3}, "cudagraph_capture_sizes": [1, 2, 4]}
    exp = servelab_tree(tmp_path / "exp", {"x": spec}, {"x": cap})
    dip = _by_kind(analyze(exp, tmp_path / "out", figures=False), "non_monotonic")[0]
    assert (dip["concurrency"], dip["batch_size"]) == (4, 3)
    assert dip["batch_size_source"] == "max_num_seqs"
    assert "padded up to 4" in dip["capture_explanation"]


def test_every_diagnosis_has_an_evidence_level_and_the_same_bytes(tmp_path: Path) -> None:
    root = vllm_bench_tree(
        tmp_path / "v100-mns12", V100_MNS12, server_log=v100_server_log(12, [1, 2])
    )
    texts = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        res = analyze(root, out, figures=False)
        for d in res.diagnoses:
            level = d["evidence_level"]
            # never tested without a test's p
            assert not level["tested"] or level["p_value"] is not None
            assert level["label"]
        texts.append([(out / n).read_bytes() for n in ("diagnoses.json", "knee.json", "report.md")])
    assert texts[0] == texts[1]


def test_steady_batch_from_telemetry_wins_over_the_concurrency() -> None:
    """With telemetry, the batch is the running requests the server held (95th percentile,
    mean over repeats), not the concurrency the client asked for."""
    from servelab.analysis.diagnoses import _batch

    class Telemetry:
        def __init__(self, running: float | None) -> None:
            self.running = running

        def mean(self, sc: str, c: int, metric: str) -> float | None:
            return self.running if metric == "running_p95" else None

    assert _batch(Telemetry(2.6), "x", 8, 12) == (3, "steady batch (running requests, telemetry)")
    assert _batch(Telemetry(None), "x", 8, 12) == (8, "concurrency")
    assert _batch(Telemetry(None), "x", 8, 4) == (4, "max_num_seqs")
