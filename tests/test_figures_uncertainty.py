"""Every figure of means draws each mean's 95% CI and the repeats it is taken over
(analysis.figures.means_with_ci), leaves invalid repeats out, and writes the same bytes twice;
and the two-sample test that judges independent runs (stats.two_sample)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from analysis_fixtures import servelab_point, servelab_tree  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from scipy import stats as sps  # noqa: E402

from servelab.analysis.dataset import load_dataset  # noqa: E402
from servelab.analysis.figures import (  # noqa: E402
    configs_side_by_side,
    latency_throughput,
    means_with_ci,
    paired_differences,
    render_all,
    throughput_vs_concurrency,
    ttft_distribution,
)
from servelab.analysis.groups import Groups  # noqa: E402
from servelab.analysis.stats import describe, paired, two_sample  # noqa: E402
from servelab.render import MEAN_CI_CAPTION, figure_style  # noqa: E402

# {config: {concurrency: [(output throughput, TTFT ms) per repeat]}}; repeat 3 of "a" at c=2
# (230 tok/s) is rewritten below with a failed request, so a validity check leaves it out.
SPEC = {
    "a": {1: [(100.0, 50.0), (110.0, 55.0), (90.0, 52.0)], 2: [(180.0, 80.0), (200.0, 90.0)]},
    "b": {1: [(95.0, 60.0), (105.0, 62.0), (101.0, 61.0)], 2: [(150.0, 100.0), (160.0, 110.0)]},
}
INVALID_TPUT = 230.0


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Groups:
    exp = servelab_tree(tmp_path_factory.mktemp("fig") / "exp", SPEC)
    servelab_point(exp, "a", 3, 2, INVALID_TPUT, 70.0, failed=1)
    servelab_point(exp, "b", 3, 2, 170.0, 105.0)
    return Groups(load_dataset(exp))


def error_bars(ax: Any) -> dict[str, ErrorbarContainer]:
    return {str(c.get_label()): c for c in ax.containers if isinstance(c, ErrorbarContainer)}


def y_intervals(bars: ErrorbarContainer) -> list[tuple[float, float, float]]:
    """(x, low, high) of each vertical error bar."""
    cols = bars.lines[2]
    segs = cols[-1].get_segments()  # the y bars come after the x bars
    return [(float(s[0][0]), float(s[0][1]), float(s[1][1])) for s in segs]


def dots(ax: Any) -> list[tuple[float, float]]:
    """Every grey dot (scatter point) of an axes."""
    out: list[tuple[float, float]] = []
    for col in ax.collections:
        if isinstance(col, PathCollection):
            out += [(float(x), float(y)) for x, y in col.get_offsets()]
    return sorted(out)


def test_throughput_vs_concurrency_draws_ci_and_repeats(groups: Groups) -> None:
    with figure_style():
        fig = throughput_vs_concurrency(groups)
    ax = fig.axes[0]
    assert MEAN_CI_CAPTION in ax.get_title()
    bars = error_bars(ax)
    assert sorted(bars) == ["a", "b"]
    for sc in ("a", "b"):
        line = bars[sc].lines[0]
        assert line is not None
        want = [describe(list(groups.values(sc, c, "output_throughput").values())) for c in (1, 2)]
        assert list(line.get_xdata()) == [1.0, 2.0]
        assert list(line.get_ydata()) == pytest.approx([d.mean for d in want])
        got = y_intervals(bars[sc])
        assert [v for row in got for v in row] == pytest.approx(
            [v for c, d in zip((1, 2), want, strict=True) for v in (c, d.ci95_low, d.ci95_high)]
        )
        assert all(lo < d.mean < hi for (_, lo, hi), d in zip(got, want, strict=True))
    # every valid repeat is a dot at its level, and the invalid one is not
    ys_at_2 = sorted(y for x, y in dots(ax) if x == 2.0)
    assert ys_at_2 == pytest.approx([150.0, 160.0, 170.0, 180.0, 200.0], rel=1e-4)
    assert bars["a"].lines[0].get_ydata()[1] == pytest.approx(190.0, rel=1e-4)
    assert len(dots(ax)) == 11
    plt.close(fig)


def test_configs_side_by_side_draws_ci_and_repeats_in_both_panels(groups: Groups) -> None:
    with figure_style():
        fig = configs_side_by_side(groups)
    assert MEAN_CI_CAPTION in fig.get_suptitle()
    tput, ttft = fig.axes
    assert not [p for p in tput.patches if p.get_height() > 0]  # no bare bars any more
    for ax, metric in ((tput, "output_throughput"), (ttft, "mean_ttft_ms")):
        bars = error_bars(ax)
        assert sorted(bars) == ["a", "b"]
        for sc in ("a", "b"):
            means = [groups.mean(sc, c, metric) for c in (1, 2)]
            assert list(bars[sc].lines[0].get_ydata()) == pytest.approx(means)
            assert len(y_intervals(bars[sc])) == 2
        values = sorted(
            v for sc in "ab" for c in (1, 2) for v in groups.values(sc, c, metric).values()
        )
        assert sorted(y for _, y in dots(ax)) == pytest.approx(values)
    assert INVALID_TPUT not in [round(y) for _, y in dots(tput)]
    plt.close(fig)


def test_latency_throughput_draws_both_intervals_and_each_repeat(groups: Groups) -> None:
    with figure_style():
        fig = latency_throughput(groups, [])
    assert MEAN_CI_CAPTION in fig.get_suptitle()
    ax = fig.axes[0]
    bars = error_bars(ax)["b"]
    assert bars.has_xerr and bars.has_yerr
    line = bars.lines[0]
    assert list(line.get_xdata()) == pytest.approx(
        [groups.mean("b", c, "output_throughput") for c in (1, 2)]
    )
    assert list(line.get_ydata()) == pytest.approx(
        [groups.mean("b", c, "mean_ttft_ms") for c in (1, 2)]
    )
    # a dot per repeat at its own (throughput, TTFT): repeat 2 of b at c=1 is (105, 62)
    assert any(
        math.isclose(x, 105.0, rel_tol=1e-4) and math.isclose(y, 62.0, rel_tol=1e-3)
        for x, y in dots(ax)
    )
    assert len(dots(ax)) == 11
    plt.close(fig)


def test_paired_differences_draws_the_mean_difference_with_its_ci(groups: Groups) -> None:
    with figure_style():
        fig = paired_differences(groups)
    ax = fig.axes[0]
    assert MEAN_CI_CAPTION in ax.get_title()
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # a: c=1 vs 2, b: c=1 vs 2
    va, vb = groups.pair("b", 1, "b", 2, "output_throughput")
    rel = [100.0 * (x / y - 1) for x, y in zip(va, vb, strict=True)]
    d = describe(rel)
    assert bars[1].lines[0].get_ydata()[0] == pytest.approx(d.mean)
    (interval,) = y_intervals(bars[1])
    assert list(interval) == pytest.approx([1.0, d.ci95_low, d.ci95_high])
    assert sorted(y for x, y in dots(ax) if x == 1.0) == pytest.approx(sorted(rel))
    # config a's pair has two repeats left (its repeat 3 at c=2 is invalid)
    assert len([1 for x, _ in dots(ax) if x == 0.0]) == 2
    plt.close(fig)


def test_one_repeat_has_no_interval_and_no_repeat_no_mark() -> None:
    fig, ax = plt.subplots()
    bars = means_with_ci(ax, [1, 2, 3], [{1: 5.0}, {}, {1: 4.0, 2: 6.0}], label="x")
    assert bars is not None
    assert list(bars.lines[0].get_xdata()) == [1.0, 3.0]
    got = y_intervals(bars)
    assert got[0] == (1.0, 5.0, 5.0)  # one value: a zero-length bar
    d = describe([4.0, 6.0])
    assert got[1] == pytest.approx((3.0, d.ci95_low, d.ci95_high))
    assert means_with_ci(ax, [1], [{}]) is None
    plt.close(fig)


def test_figures_are_the_same_bytes_twice(groups: Groups, tmp_path: Path) -> None:
    one = render_all(groups, [], tmp_path / "one")
    two = render_all(groups, [], tmp_path / "two")
    assert len(one) == 10
    for a, b in zip(one, two, strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes(), a.name
    svg = (tmp_path / "one" / "configs_side_by_side.svg").read_text(encoding="utf-8")
    assert MEAN_CI_CAPTION in svg and "<dc:date>" not in svg


# --- two independent samples ---------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b",
    [
        ([100.0, 104.0, 98.0, 101.0], [90.0, 93.0, 91.0]),
        ([10.0, 30.0, 20.0], [12.0, 11.0, 13.0]),
        ([5.0, 5.5], [5.2, 5.1, 5.3, 4.9, 5.0]),
    ],
)
def test_two_sample_is_welch_on_the_logs(a: list[float], b: list[float]) -> None:
    t = two_sample(a, b, 0.0, 0.05)
    ref = sps.ttest_ind(np.log(a), np.log(b), equal_var=False)
    assert t.p_value == pytest.approx(float(ref.pvalue), rel=1e-9)
    assert t.mean_rel_diff_pct == pytest.approx(100.0 * (np.mean(a) / np.mean(b) - 1.0))
    assert (t.n_a, t.n_b) == (len(a), len(b))
    wins = sum(1 for x in a for y in b if x > y)
    assert t.agree == f"{wins}/{len(a) * len(b)}"
    real = float(ref.pvalue) < 0.05
    assert t.verdict == (
        ("a > b" if np.mean(a) > np.mean(b) else "a < b") if real else "not significant"
    )


def test_two_sample_uses_pairs_threshold_rule() -> None:
    a, b = [100.0, 104.0, 98.0, 101.0], [90.0, 93.0, 91.0]  # +10.4%, p < 0.001
    assert two_sample(a, b, 5.0, 0.05).verdict == "a > b"
    assert two_sample(b, a, 5.0, 0.05).verdict == "a < b"
    # real by the test, too small to matter: not significant, as `paired` says
    assert two_sample(a, b, 15.0, 0.05).verdict == "not significant"
    assert paired([110.0, 111.0, 112.0], [100.0, 101.0, 102.0], 15.0, 0.05).verdict == (
        "not significant"
    )
    # large but noisy: not significant
    noisy = two_sample([50.0, 150.0, 100.0], [80.0, 85.0, 90.0], 5.0, 0.05)
    assert noisy.p_value is not None and noisy.p_value > 0.05
    assert noisy.verdict == "not significant"


def test_two_sample_says_when_it_cannot_test() -> None:
    assert two_sample([1.0], [2.0, 3.0], 5.0, 0.05).verdict == "not testable: n = 1 and 2"
    assert two_sample([1.0, 0.0], [2.0, 3.0], 5.0, 0.05).p_value is None
    assert two_sample([], [2.0, 3.0], 5.0, 0.05).verdict.startswith("not testable")
    # no spread on either side: the sign decides
    same = two_sample([110.0, 110.0], [100.0, 100.0], 5.0, 0.05)
    assert same.p_value == 0.0 and same.verdict == "a > b"
    assert two_sample([100.0, 100.0], [100.0, 100.0], 5.0, 0.05).verdict == "not significant"


def test_a_figure_without_a_valid_repeat_has_no_empty_legend(tmp_path: Path) -> None:
    """Every repeat left out by a validity check: no mean is drawn, and no empty legend box
    (matplotlib draws one, with a warning, for a legend without labelled artists)."""
    exp = servelab_tree(tmp_path / "exp", {"a": {1: [(100.0, 50.0)]}})
    servelab_point(exp, "a", 1, 1, 100.0, 50.0, failed=1)
    g = Groups(load_dataset(exp))
    assert g.values("a", 1, "output_throughput") == {}
    with figure_style():
        figs = [throughput_vs_concurrency(g), latency_throughput(g, []), configs_side_by_side(g)]
    for fig in figs:
        assert all(ax.get_legend() is None for ax in fig.axes)
        plt.close(fig)
    # nor a log axis with nothing positive on it: it says so instead
    with warnings.catch_warnings(), figure_style():
        warnings.simplefilter("error")
        ttft = ttft_distribution(g)
    assert ttft.axes[0].get_yscale() == "linear"
    assert [t.get_text() for t in ttft.axes[0].texts] == ["no valid repeat"]
    plt.close(ttft)
    with figure_style():
        ok = throughput_vs_concurrency(Groups(load_dataset(servelab_tree(tmp_path / "ok", SPEC))))
    assert ok.axes[0].get_legend() is not None  # with means, the legend is there
    plt.close(ok)
