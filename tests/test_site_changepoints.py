"""The history page's change points (site.history_changes, analysis.changepoints): what the
committed quickstart-cpu history says of each series, and the words of a change point set
against the host's speed."""

from __future__ import annotations

from release_fixtures import CommittedSite
from test_site import history_record, parse, text

from servelab.site import history_view


def test_committed_history_marks_where_a_series_changed(committed_site: CommittedSite) -> None:
    """Per metric, one line of change points (the step fit over v3 to v6, the only run of three
    comparable releases), a column per series, and the triangles in the figure's text."""
    page = committed_site.out / "experiments" / "quickstart-cpu" / "history.html"
    words = text(page)
    assert (
        "Change points of output_throughput: 1 of 10 series changed: max-num-seqs-8 at 1: v4 to "
        "v5 -13.9% (host speed not recorded); 9 no change point." in words
    )
    assert (
        "Change points of mean_tpot_ms: 1 of 10 series changed: max-num-seqs-8 at 1: v4 to v5 "
        "+17.7% (host speed not recorded); 9 no change point." in words
    )
    assert (
        "Change points of p99_tpot_ms: 1 of 10 series changed: max-num-seqs-1 at 16: v3 to v4 "
        "-31.8% (host speed not recorded); 9 no change point." in words
    )
    for metric in ("mean_ttft_ms", "p99_ttft_ms"):
        assert f"Change points of {metric}: 0 of 10 series changed; 10 no change point." in words
    # the series' column: the run judged, and its change point or "no change point"
    assert "v3 to v6: v4 to v5 -13.9% (host speed not recorded)" in words
    assert words.count("v3 to v6: no change point") == 43  # 50 series: 3 changed
    assert words.count("v4 to v6: no change point") == 4  # v3 has no valid repeat at c=8
    assert "a step must stand 4 standard errors clear of none" in words
    alts = {str(i["alt"]) for i in parse(page).imgs}
    assert any(
        a.endswith("Change points (open triangles): max-num-seqs-8 c=1 v4 to v5 -13.9%.")
        for a in alts
    )


def test_history_page_words_a_change_point_against_the_host() -> None:
    """With the canary recorded, a change point is the host's or the code's, in words; a
    history recorded without change points shows no such line or column."""
    h = history_record()
    point = {"change_pct": -30.0, "direction": None}
    runs = [
        {
            "releases": ["v1", "v2", "v3"],
            "answer": "changed",
            "normalised": True,
            "change_points": [
                {
                    **point,
                    "before": "v1",
                    "after": "v2",
                    "normalised_pct": -0.4,
                    "answer": "changed as much as the host's speed did (not attributed to the code)",
                },
                {
                    **point,
                    "before": "v2",
                    "after": "v3",
                    "normalised_pct": -29.0,
                    "answer": "changed beyond what the host explains",
                    "direction": "worse",
                },
            ],
        }
    ]
    h["series"][0]["change_points"] = runs
    h["series"][1]["change_points"] = [
        {
            "releases": ["v1", "v2"],
            "answer": "too few releases",
            "normalised": False,
            "change_points": [],
        }
    ]
    h["change_point_method"] = {
        "method": "step fit",
        "penalty": 16.0,
        "sd_floor": 0.001,
        "min_releases": 3,
    }
    view = history_view.history_view(h, {}, {})
    (tput, ttft) = view["metrics"]
    assert tput["changes"] == (
        "1 of 1 series changed: b at 8: v1 to v2 -30.0% (as the host's speed: -0.4% in its "
        "terms), v2 to v3 -30.0% (worse, beyond the host: -29.0% in its terms)."
    )
    assert tput["table"]["rows"][0]["change"].startswith("v1 to v3: v1 to v2 -30.0%")
    assert ttft["changes"] == "0 of 1 series changed; 1 too few releases."
    assert ttft["table"]["rows"][0]["change"] == "too few releases (fewer than 3 comparable)"
    del h["change_point_method"]
    for s in h["series"]:
        del s["change_points"]
    plain_view = history_view.history_view(h, {}, {})
    assert plain_view["change_method"] is None
    assert all(m["changes"] is None for m in plain_view["metrics"])
