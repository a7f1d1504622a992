"""The release history of the site (servelab.site.history) on the committed releases of
quickstart-cpu: every release analysed again by this servelab, every point's series, a verdict
per point between consecutive releases only where they are comparable, and its figures."""

from __future__ import annotations

import csv
import json
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from release_fixtures import CommittedSite

from servelab.analysis.hostspeed import HostSpeed, Span
from servelab.analysis.stats import describe
from servelab.errors import ServelabError
from servelab.site.history import (
    FDR_Q,
    VERDICTS,
    history_figure,
    history_figure_alt,
    release_history,
)
from servelab.store.jsonio import dumps

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "quickstart-cpu"
EVIDENCE = REPO / "evidence" / EXPERIMENT


def release_folders() -> list[Path]:
    """The committed releases in tag order (v1 < v2 < ... < v10)."""
    folders = [p.parent for p in EVIDENCE.glob("v*/release.json")]
    return sorted(folders, key=lambda p: int(p.name[1:]))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    started = time.perf_counter()
    out = release_history(EXPERIMENT, release_folders(), tmp_path_factory.mktemp("history"))
    print(
        f"release_history over {len(out['releases'])} releases: "
        f"{time.perf_counter() - started:.1f} s"
    )
    return out


def test_every_release_is_listed_in_order(history: dict[str, Any]) -> None:
    tags = [r["tag"] for r in history["releases"]]
    assert tags[:7] == [f"v{i}" for i in range(1, 8)]
    assert history["experiment"] == EXPERIMENT
    for r in history["releases"]:
        assert set(r) >= {
            "tag",
            "date",
            "git_commit",
            "analysis_version",
            "servelab_version",
            "vllm_version",
            "host_class",
            "points_valid",
            "points_total",
        }
        assert len(r["git_commit"]) == 40 and r["vllm_version"] == "0.32.0"
        if "error" not in r:
            assert 0 < r["points_valid"] <= r["points_total"]
    by = {r["tag"]: r for r in history["releases"]}
    assert by["v1"]["analysis_version"] == 1  # not recorded then
    assert by["v7"]["analysis_version"] == 6
    assert by["v7"]["date"].startswith("2026-12-03")
    assert "Intel" in by["v7"]["host_class"] and "avx512_bf16+amx" in by["v7"]["host_class"]
    assert all("AMD EPYC" in by[f"v{i}"]["host_class"] for i in range(1, 7))
    assert set(history["metrics"]) >= {
        "output_throughput",
        "mean_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
    }


def test_series_hold_every_analysed_release_with_its_repeats(history: dict[str, Any]) -> None:
    analysed = [r["tag"] for r in history["releases"] if "error" not in r]
    assert len(analysed) >= 6
    keys = {(s["metric"], s["server_config"], s["level"]) for s in history["series"]}
    assert len(keys) == len(history["series"])
    assert ("output_throughput", "max-num-seqs-1", 1) in keys
    for s in history["series"]:
        assert [p["tag"] for p in s["points"]] == [
            t for t in analysed if t in {p["tag"] for p in s["points"]}
        ]
        for p in s["points"]:
            assert p["n"] == len(p["repeats"]) and p["invalid"] >= 0
            d = describe(p["repeats"])
            if p["n"] == 0:
                assert p["mean"] is None
                continue
            # the repeats as written, to 9 significant digits (servelab.store.jsonio)
            close = {"rel": 1e-7, "abs": 1e-7 * abs(d.mean or 0.0)}
            assert p["mean"] == pytest.approx(d.mean, **close)
            if p["n"] >= 2:
                assert p["ci95"] == pytest.approx([d.ci95_low, d.ci95_high], **close)
            else:
                assert p["ci95"] is None


def test_v7_means_are_its_released_summary(history: dict[str, Any]) -> None:
    """This servelab's analysis of v7's raw data gives the means its own analysis released."""
    with open(EVIDENCE / "v7" / "tables" / "summary.csv", encoding="utf-8") as fh:
        released = {
            (r["metric"], r["server_config"], int(r["concurrency"])): float(r["mean"])
            for r in csv.DictReader(fh)
            if r["mean"]
        }
    seen = 0
    for s in history["series"]:
        key = (s["metric"], s["server_config"], s["level"])
        mine = [p for p in s["points"] if p["tag"] == "v7"]
        if key in released and mine:
            assert mine[0]["mean"] == pytest.approx(released[key], rel=1e-5), key
            seen += 1
    assert seen >= 20


def test_every_consecutive_pair_has_a_verdict_per_point(history: dict[str, Any]) -> None:
    tags = [r["tag"] for r in history["releases"]]
    assert [(p["before"], p["after"]) for p in history["pairs"]] == list(
        zip(tags, tags[1:], strict=False)
    )
    for pair in history["pairs"]:
        assert pair["points"], pair["before"]
        verdicts = {p["verdict"] for p in pair["points"]}
        assert verdicts <= set(VERDICTS)
        if not pair["comparable"]:
            assert verdicts == {"not comparable"}
            assert pair["why_not"] and "\n" not in pair["why_not"]
            assert all(p["p_value"] is None for p in pair["points"])
        else:
            assert pair["why_not"] is None and "not comparable" not in verdicts
            assert pair["host"]["class"] != "differs"


def test_the_history_names_the_engine_settings_releases_did_not_record(
    history: dict[str, Any],
) -> None:
    """The committed releases were made before the servers' engine settings were recorded:
    each pair says so per configuration, and that alone makes no pair not comparable."""
    pair = next(p for p in history["pairs"] if (p["before"], p["after"]) == ("v7", "v8"))
    assert pair["engine"] == [
        "max-num-seqs-1: effective configuration not recorded in v7 or v8",
        "max-num-seqs-8: effective configuration not recorded in v7 or v8",
    ]
    assert "engine" not in str(pair["why_not"])


def test_v6_to_v7_is_not_comparable_and_names_the_cpu(history: dict[str, Any]) -> None:
    pair = next(p for p in history["pairs"] if (p["before"], p["after"]) == ("v6", "v7"))
    assert pair["comparable"] is False
    assert pair["host"]["class"] == "differs"
    assert "CPU" in pair["why_not"] and "Intel" in pair["why_not"]
    assert "AMD EPYC" in pair["why_not"]
    assert "CPU" in pair["host"]["relevant_differences"]


def test_verdicts_follow_the_fdr_control_and_the_threshold(history: dict[str, Any]) -> None:
    """A point changed when its Benjamini-Hochberg adjusted p is at most 5% and the change
    reaches the practical threshold; no committed release records the host's speed, so a
    change is never a verdict on the code."""
    judged = changed = 0
    for pair in history["pairs"]:
        if not pair["comparable"]:
            continue
        assert pair["fdr"] == {
            "method": "Benjamini-Hochberg",
            "q": FDR_Q,
            "tests": sum(1 for p in pair["points"] if p["p_value"] is not None),
        }
        for p in pair["points"]:
            v, change = p["verdict"], p["change_pct"]
            if v == "invalid":
                assert p["p_value"] is None and p["p_adjusted"] is None
                continue
            judged += 1
            assert p["p_adjusted"] >= p["p_value"] and change is not None
            real = p["p_adjusted"] <= FDR_Q and abs(change) >= pair["threshold_pct"]
            assert v == ("host speed not recorded" if real else "unchanged"), p
            changed += real
    assert judged > 0 and changed > 0


def test_bh_calls_fewer_changes_than_the_tests_alone(history: dict[str, Any]) -> None:
    """v4 to v5: 8 points under alpha 0.05 with no multiplicity control, 2 under BH (the p99s
    of 4-64 requests per point are left out: too few to report)."""
    pair = next(p for p in history["pairs"] if (p["before"], p["after"]) == ("v4", "v5"))
    alone = [
        p
        for p in pair["points"]
        if p["p_value"] < pair["alpha"] and abs(p["change_pct"]) >= pair["threshold_pct"]
    ]
    under_bh = [p for p in pair["points"] if p["verdict"] != "unchanged"]
    assert len(alone) == 8 and len(under_bh) == 2
    assert {id(p) for p in under_bh} <= {id(p) for p in alone}


def test_the_committed_pairs_name_no_code_verdict(history: dict[str, Any]) -> None:
    """v1 to v8 record no canary: every comparable pair says so, and no point is improved,
    regressed or attributed to the code (v4 to v5 and v7 to v8 changed with the host speed
    not recorded)."""
    counts = {}
    for pair in history["pairs"]:
        verdicts = [p["verdict"] for p in pair["points"]]
        assert not {"improved", "regressed", "changed beyond what the host explains"} & set(
            verdicts
        )
        if pair["comparable"]:
            assert pair["host_speed"] == {
                "recorded": False,
                "why_not": f"host speed not recorded: neither {pair['before']} nor "
                f"{pair['after']} measured the canary",
            }
            counts[(pair["before"], pair["after"])] = verdicts.count("host speed not recorded")
        else:
            assert pair["host_speed"] is None and pair["fdr"] is None
    assert counts == {
        ("v1", "v2"): 19,
        ("v3", "v4"): 0,
        ("v4", "v5"): 2,
        ("v5", "v6"): 0,
        ("v7", "v8"): 22,
    }


def test_a_changed_server_configuration_is_judged_and_named(history: dict[str, Any]) -> None:
    """v1 to v2 changed the server's arguments: what a release may change, so the pair is
    judged (without a canary, its changes are not attributed) and names what changed; every
    other pair changed none of it."""
    changed = {(p["before"], p["after"]): p["changed"] for p in history["pairs"]}
    assert changed[("v1", "v2")] == ["config.server.args"]
    assert all(not c for k, c in changed.items() if k != ("v1", "v2"))
    (v1v2,) = [p for p in history["pairs"] if p["before"] == "v1"]
    assert v1v2["comparable"] is True and v1v2["why_not"] is None


def test_the_history_is_the_same_bytes_twice(
    history: dict[str, Any], committed_site: CommittedSite
) -> None:
    """Computed again, by the site's build over the committed evidence (once per test run,
    tests/release_fixtures.py: given the checks the build made of each release, in a work
    folder of its own), the history is the same bytes."""
    (again,) = [h for folders, h in committed_site.histories if folders == release_folders()]
    assert dumps(again) == dumps(history)
    assert json.loads(dumps(history)) == history


def test_a_release_that_cannot_be_analysed_stays_with_its_reason(tmp_path: Path) -> None:
    bad = tmp_path / "v6"
    shutil.copytree(EVIDENCE / "v6", bad)
    rel = json.loads((bad / "release.json").read_text(encoding="utf-8"))
    rel["tarball_sha256"] = "0" * 64
    (bad / "release.json").write_text(json.dumps(rel), encoding="utf-8")
    out = release_history(EXPERIMENT, [bad, EVIDENCE / "v7"], tmp_path / "work")
    first = out["releases"][0]
    assert first["tag"] == "v6" and "sha256" in first["error"]
    assert first["git_commit"] is not None  # read from the provenance beside the tarball
    assert {p["tag"] for s in out["series"] for p in s["points"]} == {"v7"}
    (pair,) = out["pairs"]
    assert pair["comparable"] is False and pair["why_not"].startswith("v6 cannot be analysed")
    assert {p["verdict"] for p in pair["points"]} == {"not comparable"}
    other = release_history("another-experiment", [EVIDENCE / "v7"], tmp_path / "w2")
    assert "experiment 'quickstart-cpu'" in other["releases"][0]["error"]
    assert other["series"] == [] and other["pairs"] == []


def test_history_figure_is_a_deterministic_svg(
    history: dict[str, Any], committed_site: CommittedSite
) -> None:
    """The same bytes when drawn again: the site's build over the committed evidence drew each
    metric's from its own history (the same bytes: test_the_history_is_the_same_bytes_twice)
    with history_figure."""
    from servelab.site import layout

    def drawn(metric: str) -> bytes:
        return (committed_site.out / layout.history_figure(EXPERIMENT, metric)).read_bytes()

    one = history_figure(history, "output_throughput")
    assert one == drawn("output_throughput")
    root = ET.fromstring(one)
    assert root.tag.endswith("svg")
    text = one.decode("utf-8")
    assert "mean, 95% CI; dots: each repeat" in text
    assert "host differs" in text  # the v6 | v7 separator's label
    assert "max-num-seqs-1" in text and "c=16" in text
    assert "<dc:date>" not in text
    latency = drawn("p99_ttft_ms")
    assert latency != one and ET.fromstring(latency).tag.endswith("svg")


def test_history_figure_alt_says_what_it_shows(history: dict[str, Any]) -> None:
    alt = history_figure_alt(history, "output_throughput")
    assert alt.startswith("output_throughput of quickstart-cpu per release (v1 to v")
    assert "means from" in alt and "tok/s" in alt
    assert "v6 to v7 (host differs)" in alt
    # and where a line changed (the triangles): the one change point of output_throughput
    # and where a line changed (the triangles): none, once the releases' own scatter counts
    assert alt.endswith(" No change point in any line.")
    assert alt.count(". ") <= 2  # at most three sentences
    # a p99 of the default's 4-64 requests per point is never reported: nothing to draw
    p99 = history_figure_alt(history, "p99_ttft_ms")
    assert "; no mean to draw (every point invalid, or too few requests to report it)." in p99
    assert "change point" not in p99.lower()
    with pytest.raises(ServelabError, match="'nope': not in the history"):
        history_figure_alt(history, "nope")
    with pytest.raises(ServelabError, match="'nope'"):
        history_figure(history, "nope")


def test_v7_to_v8_on_one_host_class_is_judged(history: dict[str, Any]) -> None:
    """Two releases of one experiment on one host class (Intel Xeon AMX, same setup): every
    point gets a verdict of the test, none is not comparable."""
    pair = next(p for p in history["pairs"] if (p["before"], p["after"]) == ("v7", "v8"))
    assert pair["comparable"] is True and pair["why_not"] is None
    assert pair["host"]["class"] != "differs"
    verdicts = {p["verdict"] for p in pair["points"]}
    assert verdicts == {"host speed not recorded", "unchanged"}
    assert all(p["p_value"] is not None for p in pair["points"] if p["verdict"] != "invalid")


def count_release_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every check of a release folder (evidence.verify.check_release_folder, under each name
    a servelab module imported it by) from now on, as the folders' names."""
    import sys

    from servelab.evidence import verify

    original = verify.check_release_folder
    seen: list[str] = []

    def counting(path: Path, workdir: Path, do_rebuild: bool = False) -> Any:
        seen.append(path.name)
        return original(path, workdir, do_rebuild)

    for name, module in list(sys.modules.items()):
        if (
            name.startswith("servelab")
            and getattr(module, "check_release_folder", None) is original
        ):
            monkeypatch.setattr(module, "check_release_folder", counting)
    return seen


def test_a_release_its_caller_checked_is_not_verified_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the checks the site build made (check_release, the bundles still extracted), the
    history verifies and extracts nothing, and says what it says when it opens them itself."""
    from servelab.site.check import check_release

    folders = release_folders()[-2:]
    checked = {p: check_release(p, tmp_path / "checks" / p.name) for p in folders}
    assert all(c.bundle is not None and not c.failures for c in checked.values())
    seen = count_release_checks(monkeypatch)
    # without checks, each release is checked once, by the history itself
    opened = release_history(EXPERIMENT, folders, tmp_path / "opened")
    assert seen == [p.name for p in folders]
    seen.clear()
    again = release_history(EXPERIMENT, folders, tmp_path / "work", checked=checked)
    assert seen == []
    assert not (tmp_path / "work").exists()  # nothing extracted
    assert dumps(again) == dumps(opened)
    assert [r["tag"] for r in again["releases"]] == [p.name for p in folders]
    assert all("error" not in r for r in again["releases"])


def test_a_checked_release_that_does_not_verify_is_never_analysed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose check failed stays in the history with its first failure and is out of
    every series, its pairs not comparable, even though its tarball was extracted (only a file
    beside it was altered)."""
    from servelab.site.check import check_release

    bad = tmp_path / "v7"
    shutil.copytree(EVIDENCE / "v7", bad)
    claims = bad / "tables" / "claims.json"
    claims.write_text(claims.read_text(encoding="utf-8").replace('"holds"', '"fails"', 1))
    good = EVIDENCE / "v8"
    checked = {p: check_release(p, tmp_path / "checks" / p.name) for p in (bad, good)}
    assert checked[bad].bundle is not None  # extracted: the copy beside it differs
    assert checked[bad].failures == ["tables/claims.json: differs from the copy inside v7.tar.gz"]
    seen = count_release_checks(monkeypatch)
    out = release_history(EXPERIMENT, [bad, good], tmp_path / "work", checked=checked)
    assert seen == []
    first = out["releases"][0]
    assert first["tag"] == "v7" and first["points_total"] is None
    shown = "/".join(bad.parts[-3:])  # as the page names it: no absolute path
    assert first["error"] == (
        f"cannot be analysed again by this servelab: {shown}: release does not verify: "
        f"tables/claims.json: differs from the copy inside v7.tar.gz; run `servelab verify "
        f"{shown}` for every failure"
    )
    assert first["git_commit"] is not None  # read from the provenance beside the tarball
    assert {p["tag"] for s in out["series"] for p in s["points"]} == {"v8"}
    (pair,) = out["pairs"]
    assert pair["comparable"] is False and pair["why_not"].startswith("v7 cannot be analysed")
    assert {p["verdict"] for p in pair["points"]} == {"not comparable"}


AS_HOST_WORDS = "changed as much as the host's speed did (not attributed to the code)"
UNKNOWN_WORDS = "unknown: the canary cannot tell the host's speed from the code's"


def timed(compute_s: float, gbs: float) -> HostSpeed:
    """A release's host speed: compute seconds and copy GB/s, each within 1%."""
    return HostSpeed(
        Span(compute_s, 0.99 * compute_s, 1.01 * compute_s),
        Span(gbs, 0.99 * gbs, 1.01 * gbs),
        4,
        (42, 1_000_000, 64),
    )


@pytest.mark.parametrize(
    ("v8_speed", "expected"),
    [
        # v8's host as fast as v7's: its 33-54% more throughput is beyond the host, better,
        # where its interval and the 10% run-to-run allowance clear the 10% margin
        ((1.0, 10.0), {"changed beyond what the host explains", UNKNOWN_WORDS}),
        # v8's host 40% faster: the throughput moved about as much as the host's speed did, but
        # one run a side cannot place it inside the margin: unknown, never beyond
        ((1.0 / 1.4, 14.0), {UNKNOWN_WORDS}),
    ],
)
def test_v7_to_v8_is_attributed_against_the_recorded_host_speed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    v8_speed: tuple[float, float],
    expected: set[str],
) -> None:
    """With the canary recorded (here given to the history in place of the releases' run.json
    files), the same changes are the code's or the host's by the gate on the host ratio."""
    from servelab.site import history as module

    speeds = {"v7": timed(1.0, 10.0), "v8": timed(*v8_speed)}
    monkeypatch.setattr(module, "read_host_speed", lambda root: speeds[root.name[-2:]])
    out = release_history(EXPERIMENT, [EVIDENCE / "v7", EVIDENCE / "v8"], tmp_path)
    (pair,) = out["pairs"]
    assert pair["host_speed"]["recorded"] is True
    tput = [p for p in pair["points"] if p["metric"] == "output_throughput"]
    changed = [p for p in tput if p["verdict"] != "unchanged"]
    assert len(changed) >= 8
    assert {p["verdict"] for p in changed} <= expected
    beyond = [p for p in changed if p["verdict"] == "changed beyond what the host explains"]
    assert all(p["direction"] == "better" and p["vs_host_pct"] > 30 for p in beyond)
    if len(expected) == 2:  # the largest changes (+54%) clear the margin and the allowance
        assert len(beyond) >= 1
    unknown = [p for p in changed if p["verdict"] == UNKNOWN_WORDS]
    assert all(
        p["why"].endswith("`servelab rerun evidence/quickstart-cpu/v7 evidence/quickstart-cpu/v8`")
        for p in unknown
    )


def test_a_damaged_canary_leaves_the_host_speed_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose run.json canary cannot be read is still analysed; its pairs say why
    the host speed is unknown and attribute nothing to the code."""
    from servelab.site import history as module

    def read(root: Path) -> HostSpeed:
        if root.name.endswith("v8"):
            raise ServelabError(f"{root}/raw/a/run.json: canary.after is missing; measure again")
        return timed(1.0, 10.0)

    monkeypatch.setattr(module, "read_host_speed", read)
    out = release_history(EXPERIMENT, [EVIDENCE / "v7", EVIDENCE / "v8"], tmp_path)
    (pair,) = out["pairs"]
    assert out["releases"][1]["points_total"] == 30 and "error" not in out["releases"][1]
    assert pair["host_speed"]["recorded"] is False
    assert pair["host_speed"]["why_not"] == (
        "v8: v8/raw/a/run.json: canary.after is missing; measure again"
    )
    verdicts = {p["verdict"] for p in pair["points"]}
    assert verdicts == {"host speed not recorded", "unchanged"}


# --- change points over the history (analysis.changepoints, site.history_changes) -----------

# the committed history's change points: the only run of three or more comparable releases is
# v3 to v6 (one AMD EPYC Zen 4 host class; v3 has no valid repeat at max-num-seqs-1 c=8, so
# that point's run is v4 to v6), and none of v1 to v8 records the host's speed. With the
# between-release variance estimated (its levels stray up to 19% beyond their repeats), none of
# its 50 series has a change point: the -13.9% at max-num-seqs-8 c=1 from v4 to v5 that the
# within-release variance alone called one is within that scatter
CHANGED_SERIES: dict[tuple[str, str, int], tuple[str, str, float]] = {}


def test_committed_series_have_change_points_or_none(history: dict[str, Any]) -> None:
    """Every series is cut at the pairs that are not comparable (v1, v2 | v3..v6 | v7, v8):
    runs shorter than three releases have too few, v3 to v6 is judged, and none of its 30
    series with values changed (a change point would have the host speed not recorded); the
    p99 series have none (4-64 requests per point cannot report a p99)."""
    assert history["change_point_method"] == {
        "method": "step fit, between-release variance by DerSimonian-Laird",
        "penalty": 16.0,
        "sd_floor": 0.001,
        "min_releases": 3,
    }
    changed = {}
    for s in history["series"]:
        runs = s["change_points"]
        measured = [p["tag"] for p in s["points"] if p["repeats"]]
        assert [t for r in runs for t in r["releases"]] == measured
        if not measured:  # a p99 no release has the requests to report: nothing to judge
            assert s["metric"].startswith("p99_") and runs == []
            continue
        short = [r["releases"] for r in runs if r["answer"] == "too few releases"]
        # v1 to v2 (v2 alone where v1 has no valid repeat of the point)
        assert all(len(tags) < 3 for tags in short) and (["v1", "v2"] in short or ["v2"] in short)
        (judged,) = [r for r in runs if r["answer"] != "too few releases"]
        assert judged["releases"] in (["v3", "v4", "v5", "v6"], ["v4", "v5", "v6"])
        assert 0.0 <= judged["between_sd"] < 0.25
        key = (s["metric"], s["server_config"], s["level"])
        if judged["answer"] == "no change point":
            assert judged["change_points"] == []
            continue
        assert judged["answer"] == "changed"
        (c,) = judged["change_points"]
        assert c["answer"] == "host speed not recorded" and c["direction"] is None
        assert c["vs_host_pct"] is None
        changed[key] = (c["before"], c["after"], round(c["change_pct"], 1))
    assert changed == CHANGED_SERIES


def test_committed_changes_are_gated_with_the_canary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given canaries (in place of the releases' run.json files) in which v5's and v6's host
    ran 14% slower than v3's and v4's: no series is rescaled, so no change point appears, and
    v4 to v5's two changes are set against the host ratio by the gate: none is beyond the
    host (one run a side cannot place a 14-18% change outside the margin)."""
    from servelab.site import history as module

    slow = 1.0 / 0.86
    speeds = {
        "v3": timed(1.0, 10.0),
        "v4": timed(1.0, 10.0),
        "v5": timed(slow, 8.6),
        "v6": timed(slow, 8.6),
    }
    monkeypatch.setattr(module, "read_host_speed", lambda root: speeds[root.name[-2:]])
    folders = [EVIDENCE / t for t in ("v3", "v4", "v5", "v6")]
    out = release_history(EXPERIMENT, folders, tmp_path)
    assert all(r["change_points"] == [] for s in out["series"] for r in s["change_points"])
    pair = next(p for p in out["pairs"] if p["before"] == "v4")
    assert pair["host_speed"]["ratio"] == pytest.approx(0.86, rel=0.01)
    changed = [p for p in pair["points"] if p["verdict"] not in ("unchanged", "invalid")]
    assert len(changed) == 2
    assert {p["verdict"] for p in changed} <= {AS_HOST_WORDS, UNKNOWN_WORDS}
    for p in changed:
        if p["verdict"] == UNKNOWN_WORDS:
            assert p["why"].endswith(
                "`servelab rerun evidence/quickstart-cpu/v4 evidence/quickstart-cpu/v5`"
            )


def test_the_committed_history_keeps_no_verdict_beyond_the_host(history: dict[str, Any]) -> None:
    """No release of v1 to v8 records its canary: no pair point and no change point may say
    "beyond the host", which now needs a host-adjusted interval wholly outside the margin."""
    verdicts = {p.get("verdict") for pair in history["pairs"] for p in pair["points"]}
    answers = {
        c["answer"]
        for s in history["series"]
        for r in s["change_points"]
        for c in r["change_points"]
    }
    assert "changed beyond what the host explains" not in verdicts | answers
    assert "host speed not recorded" in verdicts
