"""The history page's change points (site.history_changes, analysis.changepoints): what the
committed quickstart-cpu history says of each series, and the words of a change point set
against the host's speed."""

from __future__ import annotations

from release_fixtures import CommittedSite
from test_site import history_record, parse, text

from servelab.site import history_view


def test_committed_history_marks_where_a_series_changed(committed_site: CommittedSite) -> None:
    """Per metric, one line of change points (the step fit over v3 to v6, the only run of three
    comparable releases), a column per series, and the figure's text: with the releases' own
    scatter counted in, none of the 30 series with values changed; and the legend lists the UNKNOWN answer
    with the rerun command and says what "beyond the host" needs."""
    page = committed_site.out / "experiments" / "quickstart-cpu" / "history.html"
    words = text(page)
    for metric in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
        assert f"Change points of {metric}: 0 of 10 series changed; 10 no change point." in words
    # the p99s of 4-64 requests per point: never reported, so nothing to judge
    for metric in ("p99_ttft_ms", "p99_tpot_ms"):
        assert f"Change points of {metric}: 0 of 10 series changed; 10 no values." in words
    # the series' column: the run judged, and "no change point"
    assert words.count("v3 to v6: no change point") == 28
    assert words.count("v4 to v6: no change point") == 2  # v3 has no valid repeat at c=8
    assert "a step must stand 4 standard errors clear of none" in words
    assert "a release up and back down at the next is one excursion" in words
    assert "lies wholly outside the equivalence margin" in words
    assert "servelab rerun REFERENCE_BUNDLE CURRENT_BUNDLE" in words
    # no pair and no change point says "beyond the host": the legend's words alone
    for word in ("better, beyond the host", "worse, beyond the host"):
        assert words.count(word) == 1, word
    alts = {str(i["alt"]) for i in parse(page).imgs}
    assert any(a.endswith("No change point in any line.") for a in alts)


def test_history_page_words_a_change_point_against_the_host() -> None:
    """With the canary recorded, a change point is the host's or the code's, in words; a
    history recorded without change points shows no such line or column."""
    h = history_record()
    point = {"change_pct": -30.0, "direction": None, "kind": "step", "why": None}
    runs = [
        {
            "releases": ["v1", "v2", "v3", "v4"],
            "answer": "changed",
            "between_sd": 0.01,
            "change_points": [
                {
                    **point,
                    "before": "v1",
                    "after": "v2",
                    "vs_host_pct": -0.4,
                    "answer": "changed as much as the host's speed did (not attributed to the code)",
                },
                {
                    **point,
                    "before": "v2",
                    "after": "v3",
                    "vs_host_pct": -29.0,
                    "answer": "changed beyond what the host explains",
                    "direction": "worse",
                },
                {
                    **point,
                    "before": "v3",
                    "after": "v4",
                    "kind": "excursion",
                    "vs_host_pct": 20.0,
                    "answer": "unknown: the canary cannot tell the host's speed from the code's",
                    "why": "the canary's drift was moved in v4; compare both on one host: "
                    "`servelab rerun evidence/e/v3 evidence/e/v4`",
                },
            ],
        }
    ]
    h["series"][0]["change_points"] = runs
    h["series"][1]["change_points"] = [
        {
            "releases": ["v1", "v2"],
            "answer": "too few releases",
            "between_sd": 0.0,
            "change_points": [],
        }
    ]
    h["change_point_method"] = {
        "method": "step fit, between-release variance by DerSimonian-Laird",
        "penalty": 16.0,
        "sd_floor": 0.001,
        "min_releases": 3,
    }
    view = history_view.history_view(h, {}, {})
    (tput, ttft) = view["metrics"]
    assert tput["changes"] == (
        "1 of 1 series changed: b at 8: v1 to v2 -30.0% (as the host's speed: -0.4% against "
        "the host), v2 to v3 -30.0% (worse, beyond the host: -29.0% against the host), "
        "excursion at v4 -30.0% (back at the next release) (unknown: the canary cannot tell; "
        "the canary's drift was moved in v4; compare both on one host: `servelab rerun "
        "evidence/e/v3 evidence/e/v4`)."
    )
    assert tput["table"]["rows"][0]["change"].startswith("v1 to v4: v1 to v2 -30.0%")
    assert ttft["changes"] == "0 of 1 series changed; 1 too few releases."
    assert ttft["table"]["rows"][0]["change"] == "too few releases (fewer than 3 comparable)"
    del h["change_point_method"]
    for s in h["series"]:
        del s["change_points"]
    plain_view = history_view.history_view(h, {}, {})
    assert plain_view["change_method"] is None
    assert all(m["changes"] is None for m in plain_view["metrics"])
