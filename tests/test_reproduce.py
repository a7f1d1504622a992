"""Reproduction against a frozen release: known answers on hand-built experiments."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import KNEE_SPEC, vllm_bench_tree
from bundle_fixtures import experiment
from host_fixtures import AMD, host, isa
from workflow_env import snakemake_env

from servelab import config as cfgmod
from servelab.cli import main
from servelab.errors import ServelabError
from servelab.evidence.bundle import build_bundle
from servelab.evidence.files import safe_extract, write_deterministic_tar
from servelab.evidence.release import release
from servelab.experiment import Experiment, ReproductionSection
from servelab.hostfacts.compare import ISA_FLAGS
from servelab.reproduce import (
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    check_reference,
    compare,
    report_markdown,
    verdict_lines,
)
from servelab.store.hashing import sha256_file
from servelab.store.jsonio import read_json, write_json
from servelab.store.paths import ExperimentPaths

REPO = Path(__file__).resolve().parents[1]
CLAIMS = ["throughput[c=128] > throughput[c=256]", "dominated(c=256)"]
# The published fresh-host rerun: every level 3-5% slower, C128 still ahead of C256 (5.6%).
CLEAN_ROOM = {
    64: [(4100.0, 310.0), (4114.0, 312.0), (4129.0, 309.0)],
    128: [(4800.0, 430.0), (4815.0, 428.0), (4828.0, 433.0)],
    256: [(4545.0, 760.0), (4560.0, 758.0), (4574.0, 765.0)],
}
# C256 now ahead of C128: the knee moved.
BROKEN = {
    64: [(4100.0, 310.0), (4114.0, 312.0), (4129.0, 309.0)],
    128: [(4800.0, 430.0), (4815.0, 428.0), (4828.0, 433.0)],
    256: [(5045.0, 760.0), (5060.0, 758.0), (5074.0, 765.0)],
}


def settings(**changes: Any) -> ReproductionSection:
    """The `reproduction:` section at the schema's defaults, with `changes`."""
    return replace(cfgmod.default_section(ReproductionSection, "reproduction"), **changes)


@dataclass
class Analysed:
    """The experiments this module has analysed, by what they were made of (an experiment's
    analysis, tables and figures, about 1.5 s, depends on its spec, claims and model seed
    only), in `folder`."""

    folder: Path | None = None
    made: dict[str, tuple[Path, Experiment]] = field(default_factory=dict)


ANALYSED = Analysed()


@pytest.fixture(scope="module", autouse=True)
def analysed_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ANALYSED for this module's tests only."""
    ANALYSED.folder = tmp_path_factory.mktemp("analysed")
    yield
    ANALYSED.folder = None
    ANALYSED.made.clear()


def analysed_experiment(
    tmp: Path, spec: Any, claims: list[str], seed: int = 0
) -> tuple[ExperimentPaths, Experiment]:
    """bundle_fixtures.experiment(tmp, spec, claims, tiny_seed=seed), finished and analysed:
    a copy, the caller's to change, of the one this module made of the same (ANALYSED)."""
    key = json.dumps([sorted(spec.items()), claims, seed])
    if key not in ANALYSED.made:
        assert ANALYSED.folder is not None
        base = ANALYSED.folder / f"{len(ANALYSED.made):03d}"
        _, exp = experiment(base, spec, claims, tiny_seed=seed)
        ANALYSED.made[key] = (base / "exp", exp)
    made, exp = ANALYSED.made[key]
    shutil.copytree(made, tmp / "exp", symlinks=True)
    return ExperimentPaths(tmp / "exp"), exp


def make_bundle(tmp: Path, spec: Any, claims: list[str] | None = None, seed: int = 0) -> Path:
    paths, exp = analysed_experiment(tmp, spec, CLAIMS if claims is None else claims, seed)
    build_bundle(exp, paths, tmp / "bundle", REPO)
    return tmp / "bundle"


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The reference release, made once: its evidence folder and the release in it."""
    tmp = tmp_path_factory.mktemp("released")
    bundle = make_bundle(tmp / "ref", KNEE_SPEC)
    return tmp / "evidence", release(bundle, "v1", tmp / "evidence", allow_unpinned=True)


@pytest.fixture
def reference(released: tuple[Path, Path], tmp_path: Path) -> Path:
    """A copy of the release of every test's own (some tamper with it), at the same place in
    an evidence folder of the test's own."""
    evidence, rel = released
    dest = tmp_path / "evidence" / rel.relative_to(evidence)
    shutil.copytree(rel, dest, symlinks=True)
    return dest


Fresh = Callable[..., Path]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Fresh:
    """`fresh(spec, claims=None, seed=0)`: the bundle `make_bundle` makes of them, built once
    for the module and shared by every test that asks for the same (about 2 s a bundle). Tests
    only read it: `compare` verifies each side it opens, so a test that changed one would fail
    the next test that reads it, never pass it."""
    made: dict[str, Path] = {}

    def get(spec: Any, claims: list[str] | None = None, seed: int = 0) -> Path:
        key = json.dumps([sorted(spec.items()), claims, seed])
        if key not in made:
            made[key] = make_bundle(tmp_path_factory.mktemp("fresh"), spec, claims, seed)
        return made[key]

    return get


def test_clean_room_rerun_is_reproduced(reference: Path, tmp_path: Path, fresh: Fresh) -> None:
    out = tmp_path / "out"
    r = compare(reference, fresh(CLEAN_ROOM), out=out)
    assert r["verdict"] == REPRODUCED, r["why"]
    assert [c["verdict"] for c in r["claims"]] == [REPRODUCED, REPRODUCED]
    assert [c["fresh_verdict"] for c in r["claims"]] == ["holds", "holds"]
    # the paired advantage side by side: 4.66% in the reference, 5.58% fresh
    adv = next(
        p for p in r["paired"] if (p["a"], p["b"], p["metric"]) == (128, 256, "output_throughput")
    )
    assert adv["reference_diff_pct"] == pytest.approx(4.66, abs=0.01)
    assert adv["fresh_diff_pct"] == pytest.approx(5.58, abs=0.01)
    assert adv["status"] == "preserved" and adv["fresh_agree"] == "3/3"
    chain = next(c for c in r["chains"] if c["metric"] == "output_throughput")
    assert chain["reference"] == chain["fresh"] == "C64 < C128 > C256"
    # absolute values moved 3-5% and are reported, not judged
    tput = [p for p in r["points"] if p["metric"] == "output_throughput"]
    assert all(-5.0 < p["change_pct"] < -2.5 and p["status"] == "reported" for p in tput)
    assert tput[0]["reference_cv_pct"] is not None and tput[0]["fresh_cv_pct"] is not None
    assert r["reference"]["tag"] == "v1" and r["reference"]["kind"] == "release"
    assert r["provenance"]["blocking"] == []
    # both fixtures were built on this machine: reported, not blocking
    assert [f for f in r["provenance"]["not_clean_room"] if "host fact" in f] == [
        "every host fact is the same (CPU, cores, memory, OS, kernel): the same machine or an "
        "identical one, not shown to be another host"
    ]
    assert r["host"]["class"] == "identical"
    assert (
        r["verdict_text"]
        == "REPRODUCED on the same host or an identical one (no host fact differs)"
    )
    text = (out / "report.md").read_text()
    assert "**Verdict: REPRODUCED on the same host or an identical one" in text
    assert "C64 < C128 > C256" in text
    assert read_json(out / "reproduction.json")["verdict"] == REPRODUCED


def test_same_inputs_same_bytes(reference: Path, tmp_path: Path, fresh: Fresh) -> None:
    new = fresh(CLEAN_ROOM)
    compare(reference, new, out=tmp_path / "a")
    compare(reference, new, out=tmp_path / "b")
    for name in ("reproduction.json", "report.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_broken_ordering_is_not_reproduced(reference: Path, tmp_path: Path, fresh: Fresh) -> None:
    r = compare(reference, fresh(BROKEN))
    assert r["verdict"] == NOT_REPRODUCED
    claims = {c["claim"]: c for c in r["claims"]}
    assert claims[CLAIMS[0]]["fresh_verdict"] == "fails"
    assert claims[CLAIMS[0]]["verdict"] == NOT_REPRODUCED
    assert claims["dominated(c=256)"]["verdict"] == NOT_REPRODUCED
    adv = next(
        o
        for o in r["orderings"]
        if (o["a"], o["b"], o["metric"]) == (128, 256, "output_throughput")
    )
    assert adv["status"] == "reversed" and adv["verdict"] == NOT_REPRODUCED
    chain = next(c for c in r["chains"] if c["metric"] == "output_throughput")
    assert chain["fresh"] == "C64 < C128 < C256" and not chain["same"]


def test_model_revision_changed_is_not_comparable(
    reference: Path, tmp_path: Path, fresh: Fresh
) -> None:
    r = compare(reference, fresh(CLEAN_ROOM, seed=1))
    assert r["verdict"] == NOT_COMPARABLE
    assert r["provenance"]["blocking"] == ["model.revision"]
    assert any("model.revision differs" in f for f in r["provenance"]["not_clean_room"])
    # the numbers alone would reproduce; the verdict says they cannot be compared
    assert all(c["verdict"] == NOT_COMPARABLE for c in r["claims"])
    assert all(c["as_measured"] == REPRODUCED for c in r["claims"])


def test_tolerance_makes_absolute_values_part_of_the_verdict(
    reference: Path, tmp_path: Path, fresh: Fresh
) -> None:
    new = fresh(CLEAN_ROOM)
    assert compare(reference, new, settings(tolerance_pct=10.0))["verdict"] == REPRODUCED
    r = compare(reference, new, settings(tolerance_pct=2.0))
    assert r["verdict"] == NOT_REPRODUCED
    outside = [p for p in r["points"] if p["status"] == "outside tolerance"]
    assert {p["concurrency"] for p in outside} == {64, 128, 256}
    assert all(p["metric"] == "output_throughput" for p in outside)


def test_same_sign_without_significance(tmp_path: Path, fresh: Fresh) -> None:
    ref = fresh(KNEE_SPEC, claims=[])
    # C128 ahead of C256 on average, but not in every repeat: not a real difference
    noisy = dict(CLEAN_ROOM)
    noisy[256] = [(4900.0, 760.0), (4500.0, 758.0), (4200.0, 765.0)]
    new = fresh(noisy, claims=[])
    r = compare(ref, new, settings(metrics=("output_throughput",)))
    adv = next(o for o in r["orderings"] if (o["a"], o["b"]) == (128, 256))
    assert adv["status"] == "same sign, not significant"
    assert r["verdict"] == NOT_REPRODUCED
    loose = settings(metrics=("output_throughput",), require_significance=False)
    assert compare(ref, new, loose)["verdict"] == REPRODUCED


def test_min_effect_leaves_small_differences_unjudged(tmp_path: Path, fresh: Fresh) -> None:
    ref = fresh(KNEE_SPEC, claims=[])
    r = compare(ref, fresh(BROKEN, claims=[]), settings(min_effect_pct=10.0))
    judged = {(o["a"], o["b"], o["metric"]) for o in r["orderings"]}
    assert (128, 256, "output_throughput") not in judged  # 4.7% < 10%
    assert (64, 128, "output_throughput") in judged  # 17%
    assert r["verdict"] == REPRODUCED


def rewrite_release(release_dir: Path, tmp: Path, edit: Any) -> None:
    """A consistent forgery of the tarball: edit a file, re-tar, update release.json's hash."""
    rel = read_json(release_dir / "release.json")
    root = safe_extract(release_dir / rel["tarball"], tmp / "x")
    edit(root)
    digest = write_deterministic_tar(root, release_dir / rel["tarball"], root.name)
    rel["tarball_sha256"] = digest
    write_json(release_dir / "release.json", rel)


def test_tampered_reference_is_refused(reference: Path, tmp_path: Path, fresh: Fresh) -> None:
    new = fresh(CLEAN_ROOM)
    tarball = next(reference.glob("*.tar.gz"))
    saved = tarball.read_bytes()
    tarball.write_bytes(saved[:-10] + bytes(10))
    with pytest.raises(ServelabError, match=r"v1\.tar\.gz: sha256 .* differs from release\.json"):
        compare(reference, new)
    tarball.write_bytes(saved)

    def edit(root: Path) -> None:
        p = next(root.glob("raw/a100/rep01/c0128/requests.jsonl.gz"))
        b = p.read_bytes()
        p.write_bytes(b[:20] + bytes([b[20] ^ 1]) + b[21:])

    rewrite_release(reference, tmp_path, edit)
    with pytest.raises(ServelabError) as exc:
        compare(reference, new)
    msg = str(exc.value)
    assert "reference does not verify" in msg and "c0128/requests.jsonl.gz" in msg
    assert "\n" not in msg
    with pytest.raises(ServelabError, match="reference does not verify"):
        check_reference(reference)


def test_small_files_must_match_the_tarball(reference: Path, tmp_path: Path, fresh: Fresh) -> None:
    prov = read_json(reference / "provenance.json")
    prov["model"]["revision"] = "0" * 64
    write_json(reference / "provenance.json", prov)
    with pytest.raises(ServelabError, match="provenance.json: differs from the copy inside"):
        compare(reference, fresh(CLEAN_ROOM))


def test_malformed_claims_give_one_line(reference: Path, tmp_path: Path, fresh: Fresh) -> None:
    new = fresh(CLEAN_ROOM)
    with pytest.raises(ServelabError, match=r"claims: 'throughput > 5' is not a claim"):
        compare(reference, new, settings(claims=("throughput > 5",)))
    with pytest.raises(ServelabError, match=r"reproduction\.claims\[0\]: 'knee\(\)\)' is not"):
        cfgmod.validate(
            {
                "server": {"configs": [{"name": "a"}]},
                "sweep": {"concurrency": [1]},
                "reproduction": {"claims": ["knee())"]},
            },
            source="cfg.yaml",
        )
    with pytest.raises(ServelabError, match=r"reference: 'nowhere/v9' not found"):
        cfgmod.validate(
            {
                "server": {"configs": [{"name": "a"}]},
                "sweep": {"concurrency": [1]},
                "reference": "nowhere/v9",
            },
            source="cfg.yaml",
        )


def test_claim_on_a_config_the_fresh_run_lacks_is_not_comparable(
    reference: Path, tmp_path: Path, fresh: Fresh
) -> None:
    # the fresh run measured only 64 and 128: the claims about 256 cannot be judged
    partial = {c: v for c, v in CLEAN_ROOM.items() if c != 256}
    r = compare(reference, fresh(partial, claims=[]))
    claims = {c["claim"]: c for c in r["claims"]}
    assert claims[CLAIMS[0]]["verdict"] == NOT_COMPARABLE
    assert "not measured" in claims[CLAIMS[0]]["reason"]
    assert r["verdict"] in (NOT_COMPARABLE, NOT_REPRODUCED)
    assert r["verdict"] != REPRODUCED


def test_compare_cli_on_vllm_bench_trees(tmp_path: Path, capsys: Any) -> None:
    ref = vllm_bench_tree(tmp_path / "published", KNEE_SPEC)
    good = vllm_bench_tree(tmp_path / "rerun", CLEAN_ROOM)
    bad = vllm_bench_tree(tmp_path / "moved", BROKEN)
    args = [str(ref), str(good), "--claim", CLAIMS[0], "--out", str(tmp_path / "o")]
    assert main(["compare", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("reproduction: REPRODUCED")
    r = read_json(tmp_path / "o" / "reproduction.json")
    assert r["reference"]["kind"] == "vllm-bench"
    assert r["notes"] == [
        "fresh configuration 'rerun' compared with reference configuration 'published'"
    ]
    assert any("no provenance" in f for f in r["provenance"]["not_clean_room"])
    assert main(["compare", str(ref), str(bad), "--claim", CLAIMS[0]]) == 1
    out = capsys.readouterr().out
    assert "NOT REPRODUCED" in out and "ordering published C128 vs C256" in out
    # a reference with nothing to judge: no real difference, no claim
    flat = vllm_bench_tree(tmp_path / "flat", {1: [(10.0, 5.0)] * 3, 2: [(10.0, 5.0)] * 3})
    assert main(["compare", str(flat), str(flat), "--metric", "output_throughput"]) == 3
    assert "NOT COMPARABLE" in capsys.readouterr().out


def test_bench_model_id_differing_is_not_comparable(tmp_path: Path) -> None:
    ref = vllm_bench_tree(tmp_path / "a", KNEE_SPEC)
    new = vllm_bench_tree(tmp_path / "b", CLEAN_ROOM)
    for root, model in ((ref, "Qwen/Qwen2.5-3B-Instruct"), (new, "Qwen/Qwen2.5-7B-Instruct")):
        for f in root.glob("rep_*/concurrency_*/benchmark.json"):
            data = json.loads(f.read_text())
            data["model_id"] = model
            f.write_text(json.dumps(data))
    r = compare(ref, new)
    assert r["verdict"] == NOT_COMPARABLE and r["provenance"]["blocking"] == ["benchmark.model_id"]


def test_workflow_verifies_the_reference_before_anything_runs(
    reference: Path, tmp_path: Path
) -> None:
    def dry(ref: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "snakemake",
                "-n",
                "--cores",
                "1",
                "--config",
                f"reference={ref}",
                f"results_dir={tmp_path / 'results'}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=snakemake_env(),
            timeout=300,
        )

    ok = dry(reference)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"reference: {reference} verified (release, tag v1," in ok.stderr
    assert "reproduce" in ok.stdout
    shutil.copytree(reference, tmp_path / "bad")
    tarball = next((tmp_path / "bad").glob("*.tar.gz"))
    tarball.write_bytes(tarball.read_bytes()[:-10] + bytes(10))
    bad = dry(tmp_path / "bad")
    assert bad.returncode != 0
    assert "reference error:" in bad.stderr and "differs from release.json" in bad.stderr
    assert "sweep" not in bad.stdout
    assert sha256_file(tarball) != read_json(tmp_path / "bad" / "release.json")["tarball_sha256"]


# --- the host a reproduction ran on -------------------------------------------------------


def host_bundle(
    tmp: Path,
    spec: Any,
    host_facts: dict[str, Any],
    runtime_isa: dict[str, Any] | None,
    canary: tuple[float, float] | None = None,
) -> Path:
    """A bundle recorded on the given host; runtime_isa None: a runtime record without `isa`
    (bundles made before the runtime stage probed it); `canary` (compute seconds, copy GB/s):
    every run.json records that host-speed canary before and after its sweep."""
    paths, exp = analysed_experiment(tmp, spec, CLAIMS)
    if runtime_isa is not None:
        rt = read_json(paths.runtime / "runtime.json")
        write_json(paths.runtime / "runtime.json", {**rt, "isa": runtime_isa})
    if canary is not None:
        for sc in sorted(p.name for p in paths.raw.iterdir() if p.is_dir()):
            run = paths.run(sc)
            doc = read_json(run) if run.is_file() else run_record(sc)
            write_json(run, {**doc, "canary": canary_record(*canary)})
    build_bundle(exp, paths, tmp / "bundle", REPO, host=host_facts)
    return tmp / "bundle"


def run_record(sc: str) -> dict[str, Any]:
    return {
        "format_version": 1,
        "server_config": sc,
        "status": "complete",
        "points": 0,
        "launches": 1,
        "plan": [],
    }


def canary_record(compute_s: float, gbs: float) -> dict[str, Any]:
    """run.json's `canary`: a host whose fixed work takes `compute_s` s and copies at `gbs`
    GB/s, each within 1%, before and after the sweep."""

    def part(unit: str, m: float) -> dict[str, Any]:
        return {"unit": unit, "median": m, "low": 0.99 * m, "high": 1.01 * m, "repeats": 5}

    c = {
        "compute": part("s", compute_s),
        "bandwidth": part("GB/s", gbs),
        "checksum": 42,
        "iterations": 1_000_000,
        "buffer_mib": 64,
    }
    from servelab.hostfacts.canary import CpuCanary, drift

    timed = CpuCanary.from_json(c)
    return {"before": c, "after": c, "drift": drift(timed, timed).to_json()}


@pytest.fixture(scope="module")
def spr_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference, recorded on an AVX-512 + AMX host whose runtime used AVX512: built once
    for the module (the tests only read it, and `compare` verifies it each time)."""
    return host_bundle(tmp_path_factory.mktemp("spr") / "ref", KNEE_SPEC, host(), isa("AVX512"))


NO_AVX512 = {"avx512f": False, "avx512_bf16": False}


def test_failure_on_a_host_without_avx512_names_the_flags(
    spr_reference: Path, tmp_path: Path
) -> None:
    new = host_bundle(tmp_path / "new", BROKEN, host(**NO_AVX512), isa("AVX2"))
    out = tmp_path / "out"
    r = compare(spr_reference, new, out=out)
    assert r["verdict"] == NOT_REPRODUCED  # the verdict itself does not change
    assert r["host"]["class"] == "differs"
    # the verdict says what kind of host; the differences are named once, in their table
    assert r["verdict_text"] == (
        "NOT REPRODUCED on a host that differs in 5 performance-relevant facts"
    )
    diffs = {d["fact"]: d for d in r["host"]["relevant_differences"]}
    assert diffs["cpu.avx512_bf16"] == {
        "fact": "cpu.avx512_bf16",
        "short": "avx512_bf16",
        "reference": True,
        "fresh": False,
    }
    assert r["host"]["other_differences"] == [] and r["host"]["unknown"] == []
    claim = next(c for c in r["claims"] if c["claim"] == CLAIMS[0])
    assert "host" not in claim  # each row says only its own verdict
    lines = verdict_lines(r)
    assert lines[0].startswith(
        "reproduction: NOT REPRODUCED on a host that differs in 5 performance-relevant facts ("
    )
    assert lines[1] == (
        "  differs: host: PyTorch CPU capability AVX512 -> AVX2, oneDNN ISA Intel AVX-512 with "
        "AMX -> Intel AVX2, ISA class avx512_bf16+amx -> avx2, avx512f, avx512_bf16"
    )
    assert lines[2].startswith(f"  claim {CLAIMS[0]!r}: NOT REPRODUCED (reference ")
    text = (out / "report.md").read_text()
    assert "**Verdict: NOT REPRODUCED on a host that differs in 5 performance-relevant " in text
    assert text.count("avx512_bf16+amx") == 1  # said once, in the table of what differs
    assert text.index("## What differs") < text.index("## Claims")
    assert "Host class: **differs**" in text
    assert "| host | cpu.avx512_bf16 | true | false | performance-relevant |" in text
    claims = text[text.index("## Claims") : text.index("## Orderings")]
    assert "| NOT REPRODUCED |" in claims and "host" not in claims
    assert read_json(out / "reproduction.json")["host"]["class"] == "differs"


def test_failure_on_an_equivalent_host_is_a_regression(spr_reference: Path, tmp_path: Path) -> None:
    other = host()
    other.update(memory_bytes=128 * 2**30, kernel="6.8.0-47-generic", python="3.11.9")
    r = compare(spr_reference, host_bundle(tmp_path / "new", BROKEN, other, isa("AVX512")))
    assert r["verdict"] == NOT_REPRODUCED
    assert r["host"]["class"] == "equivalent" and r["host"]["relevant_differences"] == []
    assert [d["fact"] for d in r["host"]["other_differences"]] == [
        "host.memory_bytes",
        "host.kernel",
        "host.python",
    ]
    # neither side measured the host-speed canary: the failure is not blamed on the code
    assert r["verdict_text"] == (
        "NOT REPRODUCED on an equivalent host (no performance-relevant difference): not "
        "attributed to the code (host speed not recorded: neither the reference nor the fresh "
        "run measured the canary)"
    )
    assert "regression" not in r["verdict_text"]
    assert r["host_speed"]["recorded"] is False
    lines = verdict_lines(r)
    assert lines[0].startswith(f"reproduction: {r['verdict_text']} (")
    assert (
        "  host speed: not recorded (neither the reference nor the fresh run measured the canary)"
        in lines
    )
    assert "Host class: **equivalent**" in report_markdown(r)
    assert not any("host fact is the same" in f for f in r["provenance"]["not_clean_room"])


EQUIVALENT = {"memory_bytes": 128 * 2**30, "kernel": "6.8.0-47-generic", "python": "3.11.9"}


@pytest.fixture(scope="module")
def timed_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """spr_reference with the host-speed canary recorded: 1 s of compute, 10 GB/s."""
    tmp = tmp_path_factory.mktemp("timed")
    return host_bundle(tmp / "ref", KNEE_SPEC, host(), isa("AVX512"), (1.0, 10.0))


def test_failure_on_an_equivalent_host_of_the_same_speed_is_a_regression(
    timed_reference: Path, tmp_path: Path
) -> None:
    """The canary says the host's speed did not move: a reversed ordering is the code's."""
    new = host_bundle(tmp_path / "new", BROKEN, host() | EQUIVALENT, isa("AVX512"), (1.0, 10.0))
    r = compare(timed_reference, new)
    assert r["verdict"] == NOT_REPRODUCED
    assert r["host_speed"]["recorded"] is True and r["host_speed"]["moved"] is False
    assert r["host_speed"]["ratio"] == pytest.approx(1.0)
    assert r["verdict_text"] == (
        "NOT REPRODUCED on an equivalent host (no performance-relevant difference): a regression"
    )


def test_failure_on_a_slower_identical_host_is_not_a_regression(
    timed_reference: Path, tmp_path: Path
) -> None:
    """The same host, 25% slower by its canary: the reversed ordering may be the host's (a
    knee moves with the host's speed), so it is not called a regression."""
    new = host_bundle(tmp_path / "new", BROKEN, host(), isa("AVX512"), (1.25, 8.0))
    out = tmp_path / "out"
    r = compare(timed_reference, new, out=out)
    assert r["verdict"] == NOT_REPRODUCED and r["host"]["class"] == "identical"
    assert r["host_speed"]["moved"] is True
    assert r["host_speed"]["ratio"] == pytest.approx(0.8)
    assert "regression" not in r["verdict_text"]
    assert r["verdict_text"].endswith(
        ": not attributed to the code (the host's speed, x0.8 of the reference's, explains "
        "every failure)"
    )
    assert "  host speed: the fresh host ran the canary at x0.8 the reference's speed" in "\n".join(
        verdict_lines(r)
    )
    report = (out / "report.md").read_text()
    assert "## Host speed" in report and "95% interval 0.7" in report and "): it moved" in report
    assert read_json(out / "reproduction.json")["fdr"]["method"] == "Benjamini-Hochberg"


def test_committed_v7_to_v8_outside_tolerance_is_not_a_regression() -> None:
    """v8 ran 33-54% faster than v7 on the same host class (a faster shared VM); with a
    5% tolerance it does not reproduce, but neither release records the host's speed: not
    attributed to the code, and the points say so."""
    evidence = REPO / "evidence" / "quickstart-cpu"
    r = compare(evidence / "v7", evidence / "v8", settings(tolerance_pct=5.0))
    assert r["verdict"] == NOT_REPRODUCED
    assert r["verdict_text"] == (
        "NOT REPRODUCED on the same host or an identical one (no host fact differs): not "
        "attributed to the code (host speed not recorded: neither the reference nor the fresh "
        "run measured the canary)"
    )
    failed = [p for p in r["points"] if p["verdict"] == NOT_REPRODUCED]
    assert len(failed) == 10
    assert {p["host_attribution"] for p in failed} <= {"host speed not recorded", "unchanged"}
    assert r["fdr"] == {"method": "Benjamini-Hochberg", "q": 0.05, "tests": 30}
    assert (
        "point max-num-seqs-1 c=1 output_throughput: outside tolerance (+44.45%; changed, "
        "host speed not recorded)" in [line.strip() for line in verdict_lines(r)]
    )


def test_reproduced_on_a_differing_host_lists_the_differences(
    spr_reference: Path, tmp_path: Path
) -> None:
    r = compare(
        spr_reference, host_bundle(tmp_path / "new", CLEAN_ROOM, host(**NO_AVX512), isa("AVX2"))
    )
    assert r["verdict"] == REPRODUCED
    assert r["host"]["class"] == "differs"
    assert r["verdict_text"] == "REPRODUCED on a host that differs in 5 performance-relevant facts"
    assert all("host" not in c for c in r["claims"])
    lines = verdict_lines(r)
    assert lines[0].startswith(f"reproduction: {r['verdict_text']} (all ")
    assert lines[1].startswith("  differs: host: PyTorch CPU capability AVX512 -> AVX2, ")
    assert lines[1].endswith("avx512f, avx512_bf16")


def test_reference_without_host_facts_says_what_is_unknown(tmp_path: Path) -> None:
    """A reference like the v1 release: CPU model name, cores, memory, OS, kernel, no ISA."""
    v1 = read_json(REPO / "evidence" / "quickstart-cpu" / "v1" / "provenance.json")["host"]
    ref = host_bundle(tmp_path / "ref", KNEE_SPEC, v1, None)
    out = tmp_path / "out"
    r = compare(ref, host_bundle(tmp_path / "new", BROKEN, host(AMD), isa("AVX2")), out=out)
    assert r["verdict"] == NOT_REPRODUCED
    h = r["host"]
    assert h["class"] == "unknown" and h["relevant_differences"] == []
    unknown = {u["fact"] for u in h["unknown"] if u["relevant"]}
    assert {"cpu.avx512_bf16", "cpu.isa_class", "runtime.cpu_capability", "cpu.family"} <= unknown
    assert all(u["missing_in"] == ["reference"] for u in h["unknown"])
    shorts = {u["short"] for u in h["unknown"] if u["relevant"]}
    named = len(shorts - set(ISA_FLAGS)) + 1  # every ISA flag counts as one fact
    assert r["verdict_text"] == (
        f"NOT REPRODUCED on a host not known to be equivalent ({named} performance-relevant "
        "facts not recorded on both sides)"
    )
    assert "regression" not in r["verdict_text"] and "equivalent host" not in r["verdict_text"]
    report = (out / "report.md").read_text()
    assert "| host | runtime.cpu_capability | not recorded | AVX2 | cannot be compared, " in report


def test_a_fresh_point_that_fails_validity_leaves_its_claims_not_comparable(
    reference: Path, tmp_path: Path
) -> None:
    """A burst-delivered point of the fresh run has no TTFT to compare: a claim and an ordering
    that read it are NOT COMPARABLE, with the validity reason, never NOT REPRODUCED."""
    import gzip

    paths, exp = analysed_experiment(tmp_path / "fresh", CLEAN_ROOM, CLAIMS)
    req = paths.point("a100", 2, 256) / "requests.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(req, "rt")]
    for r in rows:
        r["chunk_offsets_us"] = [r["done_offset_us"]] * len(r["chunk_offsets_us"])
    with gzip.open(req, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    build_bundle(exp, paths, tmp_path / "fresh" / "bundle", REPO)
    r = compare(reference, tmp_path / "fresh" / "bundle", out=tmp_path / "out")
    dom = next(c for c in r["claims"] if c["claim"].startswith("dominated"))
    assert (dom["reference_verdict"], dom["fresh_verdict"]) == ("holds", "invalid")
    assert dom["verdict"] == NOT_COMPARABLE
    assert dom["reason"].startswith("invalid in the fresh run: invalid: rep02 c=256 a100: ")
    assert "delivered in one read" in dom["reason"]
    ttft = next(
        p for p in r["paired"] if (p["a"], p["b"], p["metric"]) == (128, 256, "mean_ttft_ms")
    )
    assert ttft["status"] == "invalid in the fresh run"
    # throughput is not a latency metric: its claim and ordering are still judged
    tput = next(c for c in r["claims"] if c["claim"].startswith("throughput"))
    assert tput["verdict"] == REPRODUCED
    assert r["verdict"] == NOT_COMPARABLE


def test_unique_prompts_is_noted_not_blocking(tmp_path: Path) -> None:
    """A reference made before workload.unique_prompts existed resent the same prompts; that
    matters only to a prefix cache (checked per point), so it is a note."""
    from servelab.reproduce import Side, provenance_diff

    wl = {"seed": 0, "input_tokens": 128, "output_tokens": 64, "waves": 4}
    old = {"config": {"workload": dict(wl)}, "pipeline": {}}
    new = {"config": {"workload": {**wl, "unique_prompts": True}}, "pipeline": {}}
    hosts = {"class": "equivalent", "relevant_differences": [], "other_differences": []}
    d = provenance_diff(
        Side("ref", "release", tmp_path, provenance=old),
        Side("new", "experiment", tmp_path, provenance=new),
        hosts,
    )
    assert d["blocking"] == []
    row = next(r for r in d["fields"] if r["field"] == "config.workload.unique_prompts")
    assert row == {
        "field": "config.workload.unique_prompts",
        "reference": None,
        "fresh": True,
        "same": False,
        "effect": "note",
    }
    other = {"config": {"workload": {**wl, "unique_prompts": True, "seed": 1}}, "pipeline": {}}
    d2 = provenance_diff(
        Side("ref", "release", tmp_path, provenance=old),
        Side("new", "experiment", tmp_path, provenance=other),
        hosts,
    )
    assert d2["blocking"] == ["config.workload"]


def test_servelab_compare_prints_what_it_cannot_attribute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`servelab compare` on the committed v7 and v8 with a 5% tolerance: NOT REPRODUCED
    (exit 1), not blamed on the code, the host speed not recorded, each failed point with its
    attribution."""
    evidence = REPO / "evidence" / "quickstart-cpu"
    rc = main(["compare", str(evidence / "v7"), str(evidence / "v8"), "--tolerance-pct", "5"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert lines[0].startswith(
        "reproduction: NOT REPRODUCED on the same host or an identical one (no host fact "
        "differs): not attributed to the code (host speed not recorded"
    )
    assert not any("regression" in line for line in lines)
    assert (
        "  host speed: not recorded (neither the reference nor the fresh run measured the "
        "canary)" in lines
    )
    points = [line for line in lines if line.startswith("  point ")]
    said = [p.split("; ")[-1] for p in points]
    assert len(points) == 10
    assert set(said) == {
        "changed, host speed not recorded)",
        "no real change at the 5% false discovery rate)",
    }
    assert said.count("changed, host speed not recorded)") >= 5


def engine_bundle(tmp: Path, spec: Any, settings: dict[str, Any] | None, args: Any = None) -> Path:
    """make_bundle's bundle whose server recorded the engine `settings` it resolved ({name:
    value}, each from the engine; None: none recorded, as before they were), launched with
    server arguments `args` (the fixture's when None)."""
    paths, exp = analysed_experiment(tmp, spec, CLAIMS)
    launch = paths.root / "server" / "a100" / "launch.json"
    doc = read_json(launch)
    if args is not None:
        doc["args"] = args
    if settings is not None:
        values = {k: {"value": v, "source": "engine"} for k, v in settings.items()}
        doc["engine"] = {"settings": values, "departures": []}
    write_json(launch, doc)
    build_bundle(exp, paths, tmp / "bundle", REPO)
    return tmp / "bundle"


def test_an_unpinned_scheduling_default_that_changed_is_not_comparable(tmp_path: Path) -> None:
    """The same config on two hosts whose vLLM chose another max_num_batched_tokens (an A100's
    2048, an H100's 8192): the orderings and claims are NOT COMPARABLE, the setting named once
    at the top of the report; pinned by the arguments it is the config's own and blocks
    nothing; a side that recorded no settings says so and fails nothing."""
    a100 = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "block_size": 16}
    h100 = {"max_num_seqs": 8, "max_num_batched_tokens": 8192, "block_size": 16}
    ref = engine_bundle(tmp_path / "a", KNEE_SPEC, a100)
    r = compare(ref, engine_bundle(tmp_path / "b", CLEAN_ROOM, h100), out=tmp_path / "out")
    assert r["verdict"] == NOT_COMPARABLE
    said = (
        "engine setting of a100: max_num_batched_tokens 2048 -> 8192 "
        "(vLLM's own choice on each side: not pinned)"
    )
    assert r["provenance"]["blocking"] == [said] and said in r["why"]
    assert all(c["verdict"] == NOT_COMPARABLE for c in r["claims"])
    report = (tmp_path / "out" / "report.md").read_text()
    head, _, rest = report.partition("## Claims")
    assert "## What differs" in head and "| engine | a100: max_num_batched_tokens |" in head
    assert "max_num_batched_tokens" not in rest  # said once
    # pinned by the server arguments, both resolved alike: nothing blocks; a setting that
    # does not shape scheduling is named, and blocks nothing
    pinned = {"max-num-seqs": 8, "max-num-batched-tokens": 2048}
    ref_p = engine_bundle(tmp_path / "c", KNEE_SPEC, a100, pinned)
    new_p = engine_bundle(tmp_path / "d", CLEAN_ROOM, {**a100, "block_size": 32}, pinned)
    p = compare(ref_p, new_p)
    assert p["verdict"] == REPRODUCED and p["provenance"]["blocking"] == []
    assert [r["text"] for r in p["provenance"]["engine"]["rows"]] == [
        "block_size 16 -> 32 (vLLM's own choice on each side: not pinned)"
    ]
    # a reference made before the settings were recorded: said, not failed
    old = compare(engine_bundle(tmp_path / "e", KNEE_SPEC, None), new_p)
    assert old["verdict"] == REPRODUCED
    assert old["provenance"]["engine"]["not_recorded"] == [
        "a100: effective configuration not recorded in the reference"
    ]
