"""Attention paths as code paths, their steady state and the localisation verdict, on traces
built to the published A100 / Qwen2.5-3B shape (tests/seed_trace.py) and on small cases."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import jsonschema
import pytest
from experiment_fixtures import MakeJob
from nsys_fixture import fa2_splitkv
from seed_trace import (
    DECODE_X,
    LAYERS,
    MIXED_X,
    POINTS,
    PUBLISHED_POPULATION,
    Truth,
    write_seed,
)

from servelab.cli import main
from servelab.config import default_section
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection
from servelab.profile.codepaths import PathSplit, parse_path_dims, scaling_dims
from servelab.profile.forwards import Forward
from servelab.profile.kernels import KernelStat
from servelab.profile.report import write_profile
from servelab.profile.trace_analysis import TraceOptions, analyze_trace
from servelab.profile.windows import load_windows

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "src" / "servelab" / "schemas" / "profile.schema.json").read_text())
# the published per-launch duration of the mixed path in each steady state
PUBLISHED_MIXED_US = {p.label: p.mixed_us for p in POINTS}
SeedFiles = tuple[Path, Path, Path, Truth]


@pytest.fixture(scope="module")
def seed_y(tmp_path_factory: pytest.TempPathFactory) -> SeedFiles:
    return write_seed(tmp_path_factory.mktemp("seed-y"), batch_dim="y")


@pytest.fixture(scope="module")
def seed_z(tmp_path_factory: pytest.TempPathFactory) -> SeedFiles:
    return write_seed(tmp_path_factory.mktemp("seed-z"), batch_dim="z")


def cli(out: Path, trace: Path, windows: Path, *extra: str) -> dict:
    argv = ["profile", "analyze", str(trace), "--windows", str(windows), "--out", str(out)]
    assert main([*argv, *extra]) == 0
    return json.loads((out / "profile.json").read_text())


def check_seed_profile(prof: dict, truth: Truth) -> None:
    """What the analysis must find on a seed-shaped trace, window by window."""
    mixed, decode = truth.path(MIXED_X), truth.path(DECODE_X)
    assert prof["settings"]["layers"] == LAYERS
    assert prof["settings"]["population_dim"] == truth.batch_dim
    assert prof["settings"]["path_dims"] == ["x", "z" if truth.batch_dim == "y" else "y"]
    assert prof["settings"]["path_dims_source"] == "found"
    # one kernel family, two instantiations (FA2's causal one on forwards that hold a prefill,
    # its non-causal one on decode-only forwards), each its own path
    assert prof["settings"]["attention_family"] == "flash_fwd_splitkv_kernel"
    inst = prof["settings"]["attention_instantiations"]
    assert [(i["label"], i["kernel"], i["calls"]) for i in inst] == [
        ("#1", "flash_fwd_splitkv_kernel", sum(wt.calls[MIXED_X] for wt in truth.windows.values())),
        (
            "#2",
            "flash_fwd_splitkv_kernel",
            sum(wt.calls[DECODE_X] for wt in truth.windows.values()),
        ),
    ]
    assert inst[0]["name"] == fa2_splitkv(causal=True)
    assert inst[1]["name"] == fa2_splitkv(causal=False)
    for label, wt in truth.windows.items():
        w = prof["windows"][label]
        # two attention paths, with the published call counts
        paths = {p["path"]: p for p in w["attention_paths"]}
        assert set(paths) == {mixed, decode}
        assert (paths[mixed]["instantiations"], paths[decode]["instantiations"]) == (
            ["#1"],
            ["#2"],
        )
        assert paths[mixed]["calls"] == wt.calls[MIXED_X]
        assert paths[decode]["calls"] == wt.calls[DECODE_X]
        assert paths[mixed]["grids"] >= 3  # several batch sizes folded into one path
        # forwards: every layer agrees; C256's window begins 16 layers before a forward's end
        fw = w["forwards"]
        assert (fw["violations"], fw["path_splits"]) == (0, 0)
        assert fw["offset"] == (16 if label == "c0256" else 0)
        # steady state of all forwards: the populations stay found (within 2%)
        s = w["steady"]
        assert (s["first"], s["last"]) == (wt.steady_first, wt.steady_last)
        assert s["population_mean"] == pytest.approx(wt.steady_population_mean, rel=1e-8)
        assert s["population_mean"] == pytest.approx(PUBLISHED_POPULATION[label], rel=0.02)
        # per path: the generator's truth, and the published figure within 3%
        sp = {p["path"]: p for p in s["paths"]}
        assert set(sp) == {mixed, decode}
        for x, name in ((MIXED_X, mixed), (DECODE_X, decode)):
            t = wt.steady[x]
            assert sp[name]["forwards"] == t.forwards
            assert sp[name]["population_mean"] == pytest.approx(t.population_mean, rel=1e-8)
            assert sp[name]["kernel_us_mean"] == pytest.approx(t.kernel_us_mean, rel=0.03)
            assert sp[name]["kernel_us_mean"] == pytest.approx(t.kernel_us_mean, rel=1e-8)
        assert sp[mixed]["kernel_us_mean"] == pytest.approx(PUBLISHED_MIXED_US[label], rel=0.03)
        assert sp[mixed]["population_mean"] == pytest.approx(PUBLISHED_POPULATION[label], rel=0.02)
        # the decode path's launch grows 0.1 us per sequence, the mixed one's about 3
        assert paths[decode]["slope_us_per_seq"] == pytest.approx(0.1, rel=1e-3)
        assert paths[mixed]["slope_us_per_seq"] > 3.0
    # between windows: the mixed path's duration doubles with its population, decode's not
    r = {(x["from"], x["to"]): {p["path"]: p for p in x["paths"]} for x in prof["ratios"]}
    m = r[("c0128", "c0256")][mixed]
    assert m["population_ratio"] == pytest.approx(218.00 / 108.83, rel=0.01)
    assert m["duration_ratio"] == pytest.approx(708.88 / 353.85, rel=0.01)
    assert r[("c0128", "c0256")][decode]["duration_ratio"] < 1.5
    # the verdict: stated, and C128 -> C256's growth is in the mixed path
    v = {(x["from"], x["to"]): x for x in prof["localisation"]}
    assert all(x["stated"] and x["reasons"] == [] for x in v.values())
    late = v[("c0128", "c0256")]
    assert late["component"] == f"attention path {mixed}"
    assert late["delta_us_per_token"] > 0
    top = late["components"][0]
    assert top["component"] == late["component"] and top["delta_us_per_token"] > 15
    assert sum(c["delta_us_per_token"] for c in late["components"]) == pytest.approx(
        late["delta_us_per_token"]
    )
    assert late["path_ratio"]["path"] == mixed
    assert late["text"].startswith("c0128 -> c0256: +")
    assert f"in attention path {mixed}" in late["text"] and "(in proportion)" in late["text"]
    early = v[("c0064", "c0128")]
    assert early["delta_us_per_token"] < 0  # C64 -> C128 gets cheaper per token overall
    assert early["component"] == f"attention path {mixed}"  # ... but the mixed path grows
    assert "the largest increase" in early["text"]


def test_seed_trace_through_the_cli(
    tmp_path: Path, seed_y: SeedFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, windows, cfg, truth = seed_y
    prof = cli(tmp_path / "out", trace, windows, "--model-config", str(cfg))
    check_seed_profile(prof, truth)
    jsonschema.validate(prof, SCHEMA)
    printed = capsys.readouterr().out
    late = prof["localisation"][1]["text"]
    assert late in printed.splitlines()
    assert "  path 9x*x16: steady 147 forwards, population 218, 708.9 µs/launch" in printed
    md = (tmp_path / "out" / "profile.md").read_text()
    assert f"Localisation: {late}" in md
    assert "| c0256 | 9x*x16 | 5400 |" in md
    rows = list(csv.DictReader((tmp_path / "out" / "steady_paths.csv").open()))
    assert [(r["window"], r["path"], r["forwards"]) for r in rows] == [
        ("c0064", "1x*x16", "244"),
        ("c0064", "9x*x16", "35"),
        ("c0128", "1x*x16", "233"),
        ("c0128", "9x*x16", "71"),
        ("c0256", "1x*x16", "210"),
        ("c0256", "9x*x16", "147"),
    ]
    fwd = list(csv.DictReader((tmp_path / "out" / "forwards.csv").open()))
    c256 = [r["path"] for r in fwd if r["window"] == "c0256"]
    assert c256[:3] == ["9x*x16"] * 3 and c256[-3:] == ["1x*x16"] * 3  # fill, drain
    assert (c256.count("9x*x16"), c256.count("1x*x16")) == (150, 213)
    ratios = list(csv.DictReader((tmp_path / "out" / "path_ratios.csv").open()))
    assert len(ratios) == 4 and {r["path"] for r in ratios} == {"1x*x16", "9x*x16"}
    kernels = list(csv.DictReader((tmp_path / "out" / "kernels.csv").open()))
    flash = [r for r in kernels if r["kernel"] == "flash_fwd_splitkv_kernel"]
    assert [(r["window"], r["instantiations"], r["calls"]) for r in flash] == [
        ("c0064", "2", "10260"),
        ("c0128", "2", "11160"),
        ("c0256", "2", "13084"),
    ]
    loc = list(csv.DictReader((tmp_path / "out" / "localisation.csv").open()))
    assert loc[0]["from"] == "c0064" and loc[0]["component"] == "attention path 9x*x16"
    assert {r["component"] for r in loc} >= {"gemm", "attention (other kernels)"}


def test_seed_trace_batch_in_grid_z(seed_z: SeedFiles) -> None:
    trace, windows, cfg, truth = seed_z
    prof = analyze_trace([trace], load_windows(windows), TraceOptions(layers=LAYERS)).profile
    assert truth.path(MIXED_X) == "9x16x*"
    check_seed_profile(prof, truth)


def test_all_forward_steady_mean_mixes_the_paths(tmp_path: Path, seed_y: SeedFiles) -> None:
    """Why per-path figures are needed: the steady mean over all forwards mixes decode and
    mixed launches and sits far below the mixed path's at C64 and C128."""
    trace, windows, _, _ = seed_y
    prof = cli(tmp_path / "out", trace, windows, "--layers", str(LAYERS))
    for label in ("c0064", "c0128"):
        mixed_all = prof["windows"][label]["steady"]["kernel_us_mean"]
        assert mixed_all < 0.5 * PUBLISHED_MIXED_US[label]


def test_path_dims_override(
    tmp_path: Path, seed_y: SeedFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, windows, cfg, truth = seed_y
    one = cli(tmp_path / "a", trace, windows, "--layers", "36", "--path-dims", "none")
    w = one["windows"]["c0128"]
    assert [(p["path"], p["grid"], p["calls"]) for p in w["attention_paths"]] == [
        ("all", [None, None, None], 2664 + 8496)
    ]
    assert [p["path"] for p in w["steady"]["paths"]] == ["all"]
    assert one["settings"]["path_dims"] == [] and one["settings"]["path_dims_source"] == (
        "--path-dims"
    )
    # one path: the verdict falls on it, and its duration is the mixed mean of both paths
    assert one["localisation"][1]["component"] == "attention path all"
    x = cli(tmp_path / "b", trace, windows, "--layers", "36", "--path-dims", "x")
    assert {p["path"] for p in x["windows"]["c0256"]["attention_paths"]} == {"9x*x*", "1x*x*"}
    argv = ["profile", "analyze", str(trace), "--windows", str(windows), "--out", str(tmp_path)]
    assert main([*argv, "--path-dims", "x,w"]) == 2
    assert "--path-dims 'x,w': give distinct grid dimensions" in capsys.readouterr().err


def test_verdict_withheld_when_ambiguous(tmp_path: Path, seed_y: SeedFiles) -> None:
    trace, windows, _, _ = seed_y
    # no layer count: no forwards, no steady state; the verdict says why
    prof = cli(tmp_path / "a", trace, windows)
    v = prof["localisation"][0]
    assert not v["stated"] and v["component"] is None and v["path_ratio"] is None
    assert "c0064: no forwards (layer count unknown or no attention launches)" in v["reasons"]
    assert "c0064: no steady state" in v["reasons"]
    assert v["text"].startswith("c0064 -> c0128: not localised (")
    assert v["components"]  # the per-token figures are still listed
    # a window without a token count, and a wrong layer count (every forward inconsistent)
    data = json.loads(windows.read_text())
    data["windows"][1]["output_tokens"] = None
    w2 = tmp_path / "w2.json"
    w2.write_text(json.dumps(data))
    prof = cli(tmp_path / "b", trace, w2, "--layers", "35")
    reasons = prof["localisation"][0]["reasons"]
    assert "c0128: no output token count" in reasons
    assert any(r.startswith("c0064: ") and "disagree on the population" in r for r in reasons)
    assert not any(v["stated"] for v in prof["localisation"])
    md = (tmp_path / "b" / "profile.md").read_text()
    assert "Localisation: c0064 -> c0128: not localised (" in md


def test_same_trace_same_bytes(tmp_path: Path, seed_y: SeedFiles) -> None:
    trace, windows, cfg, _ = seed_y
    outs = []
    for name in ("a", "b"):
        opts = TraceOptions(layers=LAYERS)
        result = analyze_trace([trace], load_windows(windows), opts)
        files = write_profile(tmp_path / name, result.profile, result)
        outs.append({p.name: p.read_bytes() for p in files})
    assert outs[0] == outs[1] and len(outs[0]) == 13


def forward(pop: int, key: object) -> Forward:
    return Forward(0, 0, 1, pop, 1, True, key)


def test_scaling_dims() -> None:
    # x follows the batch (one block row per 4 sequences), z is the head count
    fws = [forward(b, ((b + 3) // 4, b, 16)) for b in range(1, 40)]
    assert scaling_dims(fws, 1) == {0, 1}
    # x falls as the batch grows (a split count chosen from the batch size)
    fws = [forward(b, (max(1, 64 // b), b, 16)) for b in range(1, 40)]
    assert scaling_dims(fws, 1) == {0, 1}
    # x names a path (two values), however it correlates with the population
    fws = [forward(b, (9 if b > 20 else 1, b, 16)) for b in range(1, 40)]
    assert scaling_dims(fws, 1) == {1}
    # three values that do not follow the population: a path marker
    fws = [forward(b, (1 + b % 3, b, 16)) for b in range(1, 40)]
    assert scaling_dims(fws, 1) == {1}
    assert scaling_dims(fws, None) == set()
    split = PathSplit((0, 2))
    assert split.of_key((9, 110, 16)) == "9x*x16" and split.of_key(None) is None
    assert split.of_key("decode") == "decode"
    assert split.of_stat(KernelStat("k", "k", 1, 1)) == "all"  # no grid: one path
    assert split.of_stat(KernelStat("k", "k", 1, 1, path="mixed")) == "mixed"


def test_parse_path_dims() -> None:
    assert parse_path_dims(("z", "x"), "profile.path_dims") == (0, 2)
    assert parse_path_dims("x,z", "--path-dims") == (0, 2)
    assert parse_path_dims("xz", "--path-dims") == (0, 2)
    assert parse_path_dims("none", "--path-dims") == ()
    assert parse_path_dims(None, "--path-dims") is None
    with pytest.raises(ServelabError, match="distinct"):
        parse_path_dims("x,x", "--path-dims")
    assert default_section(ProfileSection, "profile").path_dims is None


def test_cpu_trace_paths_are_step_kinds() -> None:
    """A CPU trace has no grid: its paths are the engine-step kinds, each with its steady
    share; nothing about grid dimensions is claimed."""
    from test_profile_torch import FIXTURE, WINDOW

    from servelab.profile.windows import parse_windows

    windows = parse_windows({"windows": [WINDOW]}, "w")
    prof = analyze_trace([FIXTURE], windows, TraceOptions(layers=2)).profile
    assert (prof["settings"]["path_dims"], prof["settings"]["path_dims_source"]) == (None, None)
    w = prof["windows"]["c0008"]
    assert [(p["path"], p["grid"], p["grids"]) for p in w["attention_paths"]] == [
        ("mixed", None, 0),
        ("decode", None, 0),
        ("prefill", None, 0),
    ]
    assert w["forwards"]["path_splits"] == 0
    # each path its own steady state: the lone prefill and mixed steps are marked as resting
    # on fewer forwards than the minimum
    steady = {p["path"]: p for p in w["steady"]["paths"]}
    assert {k: p["forwards"] for k, p in steady.items()} == {"decode": 5, "mixed": 1, "prefill": 1}
    assert {k: p["below_minimum"] for k, p in steady.items()} == {
        "decode": False,
        "mixed": True,
        "prefill": True,
    }
    assert steady["decode"]["kernel_us_mean"] == pytest.approx(
        next(p["mean_us"] for p in w["attention_paths"] if p["path"] == "decode")
    )
    assert prof["localisation"] == [] and prof["ratios"] == []  # one window: nothing to compare
    jsonschema.validate(prof, SCHEMA)


def test_path_dims_from_the_config(tmp_path: Path, seed_y: SeedFiles, make_job: MakeJob) -> None:
    """profile.path_dims reaches the workflow's analysis (rule profile_report), and the
    schema checks it."""
    import shutil

    from test_profile_capture import gpu_config

    from servelab.experiment import Experiment
    from servelab.profile.report import analyze_capture

    trace, windows, cfg, _ = seed_y
    out = tmp_path / "profile" / "max-num-seqs-8"
    (out / "nsys").mkdir(parents=True)
    shutil.copy(trace, out / "nsys" / "profile.sqlite")
    shutil.copy(windows, out / "windows.json")
    shutil.copy(cfg, tmp_path / "config.json")
    capture = {"status": "profiled", "tool": "nsys", "traces": ["nsys/profile.sqlite"]}
    (out / "capture.json").write_text(json.dumps(capture))
    job = make_job(gpu_config(path_dims=["x"]), model_dir=tmp_path)
    assert job.exp.profile.path_dims == ("x",)
    prof = analyze_capture(job.exp.profile, job.paths, "max-num-seqs-8", job.model_dir)
    assert prof["settings"]["path_dims"] == ["x"]
    assert prof["settings"]["path_dims_source"] == "profile.path_dims"
    paths = {p["path"]: p["calls"] for p in prof["windows"]["c0256"]["attention_paths"]}
    assert paths == {"9x*x*": 5400, "1x*x*": 7684}
    jsonschema.validate(prof, SCHEMA)
    with pytest.raises(ServelabError, match="path_dims"):
        gpu_config(path_dims=["w"])
    assert Experiment.from_dict(gpu_config()).profile.path_dims is None


def test_verdict_withheld_when_nvtx_and_windows_disagree(tmp_path: Path) -> None:
    """A window found by NVTX ranges that hold another request count than windows.json
    records is ambiguous: no verdict."""
    from nsys_fixture import LAYERS as SMALL_LAYERS, scenario, scenario_windows, windows_file

    trace = scenario().write(tmp_path / "t.sqlite")
    rows = scenario_windows()
    rows[1]["requests"] = 3  # the client's NVTX ranges hold 2
    windows = windows_file(tmp_path / "w.json", rows)
    prof = cli(tmp_path / "out", trace, windows, "--layers", str(SMALL_LAYERS))
    v = prof["localisation"][0]
    assert v["reasons"] == ["c0002: the NVTX ranges hold 2 requests, windows.json 3"]
    assert not v["stated"] and v["component"] is None
    rows[1]["requests"] = 2
    windows = windows_file(tmp_path / "w2.json", rows)
    prof = cli(tmp_path / "out2", trace, windows, "--layers", str(SMALL_LAYERS))
    assert prof["localisation"][0]["stated"]


def test_a_path_below_the_minimum_is_carried_into_ratios_and_verdict() -> None:
    from servelab.profile.codepaths import MIN_STEADY_FORWARDS, _text, path_ratios

    def steady(n: int, pop: float, us: float) -> dict:
        row = {"path": "9x*x16", "forwards": n, "population_mean": pop, "kernel_us_mean": us}
        return {"paths": [{**row, "below_minimum": n < MIN_STEADY_FORWARDS}]}

    (pr,) = path_ratios(steady(2, 40.0, 150.0), steady(30, 80.0, 300.0))
    assert pr == {
        "path": "9x*x16",
        "population_ratio": 2.0,
        "duration_ratio": 2.0,
        "below_minimum": True,
    }
    top = {"component": "attention path 9x*x16", "delta_us_per_token": 3.0}
    text = _text("c0008", "c0016", 4.0, top, pr, [])
    assert text.endswith(
        f"(in proportion) (a steady state of fewer than {MIN_STEADY_FORWARDS} of the path's "
        "forwards: weak evidence)"
    )
    (ok,) = path_ratios(steady(30, 40.0, 150.0), steady(30, 80.0, 300.0))
    assert "weak evidence" not in _text("c0008", "c0016", 4.0, top, ok, [])


# --- FlashAttention-3: the population from vLLM's steps -------------------------------------


def study_profile(tmp_path: Path, kernel: str) -> dict:
    """tests/nsys_fixture.attention_study as `kernel` runs it, analysed."""
    from nsys_fixture import STUDY_LAYERS, attention_study, windows_file

    fx, windows = attention_study(kernel)
    trace = fx.write(tmp_path / f"{kernel}.sqlite")
    wins = load_windows(windows_file(tmp_path / f"{kernel}.json", windows))
    return analyze_trace([trace], wins, TraceOptions(layers=STUDY_LAYERS)).profile


def causal_paths(prof: dict) -> dict[str, bool]:
    """Each attention path of the profile -> whether its instantiation is the causal one (the
    forwards that hold a prefill): the same code path under FA2's and FA3's names."""
    from nsys_fixture import fa3_fwd

    causal_names = {fa2_splitkv(causal=True), fa3_fwd(causal=True)}
    causal = {
        i["label"]: i["name"] in causal_names for i in prof["settings"]["attention_instantiations"]
    }
    out = {}
    for w in prof["windows"].values():
        for p in w["attention_paths"]:
            (label,) = p["instantiations"]
            out[p["path"]] = causal[label]
    return out


def by_path(value: object) -> object:
    """`value` with every list of per-path rows sorted by path."""
    if isinstance(value, dict):
        return {k: by_path(v) for k, v in value.items()}
    if isinstance(value, list):
        rows = [by_path(v) for v in value]
        if rows and all(isinstance(r, dict) and "path" in r for r in rows):
            rows.sort(key=lambda r: str(r["path"]))  # type: ignore[index]
        return rows
    return value


def test_fa3_populations_come_from_vllm_steps_and_localise_as_fa2(tmp_path: Path) -> None:
    """FlashAttention-3's persistent scheduler launches every forward with a grid of the SM
    count (132 x 1 x 1 on an H100): no grid dimension follows the batch. Each forward's
    population is then its vLLM step's request count (NVTX), and the same forwards localise
    as FlashAttention-2's, whose gridY carries the batch."""
    from nsys_fixture import STUDY_CUT

    fa2, fa3 = study_profile(tmp_path, "fa2"), study_profile(tmp_path, "fa3")
    assert fa2["settings"]["population_dim"] == "y"
    assert fa3["settings"]["population_dim"] == "step"
    assert any("each forward's population is the request count of the vLLM step" in n
               for n in fa3["notes"])  # fmt: skip
    # the two code paths: FA2's grid paths, FA3's one grid split by instantiation
    c2, c3 = causal_paths(fa2), causal_paths(fa3)
    assert set(c2) == {"9x*x8", "1x*x8"} and set(c3) == {"132x1x1#1", "132x1x1#2"}
    name = {p3: next(p2 for p2, c in c2.items() if c == causal) for p3, causal in c3.items()}
    assert name == {"132x1x1#1": "9x*x8", "132x1x1#2": "1x*x8"}

    def renamed(value: object) -> object:
        """FA3's path names as FA2's, per-path lists in path order."""
        text = json.dumps(value)
        for p3, p2 in name.items():
            text = text.replace(p3, p2)
        return by_path(json.loads(text))

    for label, w3 in fa3["windows"].items():
        w2 = fa2["windows"][label]
        # c0016 begins 3 layers before a forward's end: the steps align it, as FA2's grid does
        assert w3["forwards"] == w2["forwards"]
        assert w3["forwards"]["offset"] == (STUDY_CUT if label == "c0016" else 0)
        assert renamed(w3["steady"]) == by_path(w2["steady"])
        assert w3["steps"]["agree"] and w2["steps"]["agree"]
    assert renamed(fa3["ratios"]) == by_path(fa2["ratios"])
    assert renamed(fa3["localisation"]) == by_path(fa2["localisation"])
    v = {(x["from"], x["to"]): x for x in fa3["localisation"]}
    late = v[("c0008", "c0016")]
    assert late["stated"] and late["component"] == "attention path 132x1x1#1"
    assert "population changes x2.00" in late["text"]
