"""The history of an experiment's releases: every release's raw data analysed again by this
servelab (so that one analysis judges them all), each point's metrics across the releases, and
a change verdict per point between consecutive releases; and its figures.

`release_history` gives the data (JSON-able, same releases, same bytes), `history_figure` one
metric as an SVG and `history_figure_alt` its text alternative (site.history_figure). Each
series also gets its change points over every run of three or more comparable releases
(site.history_changes, analysis.changepoints: a step fit, with the canary where recorded).

Releases are independent runs: a point's repeats of one release do not pair with another's,
so a change is tested with `stats.two_sample` (Welch's t on the logs); the tests of one pair
(every point and metric) are controlled together with Benjamini-Hochberg at a false discovery
rate of 5% (`FDR_Q`), and a discovery must reach the analysis section's practical threshold.
A change is then set against the host's speed by the gate of analysis.hostspeed (each
release's canary in its run.json): beyond what the host explains only where the host-adjusted
change's interval lies wholly outside the equivalence margin, as much as the host's speed
changed (not attributed to the code) only where it lies inside it, otherwise unknown, naming
`servelab rerun` with the two releases; where a release records no canary, "host speed not
recorded": never a verdict on the code. No verdict is given across hosts that differ in a
performance-relevant fact, across setups that differ (model, runtime, workload, measured
configuration: reproduce.provenance_diff's blocking fields) or datasets, nor next to a release
this servelab cannot analyse again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.analysis.dataset import load_dataset
from servelab.analysis.equivalence import DEFAULT_MARGIN_PCT
from servelab.analysis.hostspeed import (
    AS_HOST,
    BEYOND_HOST,
    HOST_NOT_RECORDED,
    UNCHANGED,
    UNKNOWN,
    Gate,
    HostSpeed,
    attribute,
    host_ratio,
    read_host_speed,
    rerun_command,
    why_no_ratio,
)
from servelab.analysis.stats import Ratio, benjamini_hochberg, describe, ratio_ci, two_sample
from servelab.design.level import LevelValue
from servelab.documents.declared import HostComparison, HostSpeedRecord, ProvenanceDiff
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection
from servelab.hostfacts import compare_hosts, difference_names, host_qualifier
from servelab.reproduce.checks import POINT_METRICS, Analysed, analyse
from servelab.reproduce.comparison import other_dataset
from servelab.reproduce.provenance_diff import provenance_diff
from servelab.reproduce.records import host_speed_json
from servelab.reproduce.sides import Side, bundle_side, open_side, refusal
from servelab.site.check import CheckedRelease
from servelab.site.history_changes import Known, method, series_changes
from servelab.site.history_figure import (
    history_figure as history_figure,
    history_figure_alt as history_figure_alt,
)
from servelab.site.history_records import (
    History,
    Pair,
    PairPoint,
    ReleaseRow,
    Series,
    SeriesPoint,
)
from servelab.site.values import host_class
from servelab.store.jsonio import dumps, read_json

# the point metrics the history shows, and which way is better for each
METRICS: tuple[str, ...] = tuple(POINT_METRICS)
HIGHER_IS_BETTER = frozenset({"output_throughput", "request_throughput", "total_token_throughput"})
INVALID, NOT_COMPARABLE = "invalid", "not comparable"
VERDICTS = (BEYOND_HOST, AS_HOST, UNKNOWN, HOST_NOT_RECORDED, UNCHANGED, INVALID, NOT_COMPARABLE)
FDR_Q = 0.05  # the false discovery rate over the tests of one pair (Benjamini-Hochberg)


@dataclass
class _Release:
    """One release as the history reads it: its provenance, and its analysis or why there is
    none."""

    tag: str
    # provenance.json as read beside the tarball (unverified, for a release that cannot be
    # opened), then the opened side's
    provenance: Mapping[str, Any] | None
    side: Side | None = None
    # its recorded analysis options and its analysis, both None when `error` says why
    opts: AnalysisSection | None = None
    analysed: Analysed | None = None
    error: str | None = None
    # its host speed (the canaries of its run.json files), or why there is none
    host: HostSpeed | None = None
    host_error: str | None = None
    # the folder as a page and a rerun command name it (evidence/<experiment>/<tag>)
    shown: str = ""


def _beside(path: Path) -> tuple[str, Mapping[str, Any] | None, dict[str, Any]]:
    """The tag (release.json's, else the folder's name), the provenance.json beside the
    tarball and release.json ({} when unreadable), read without opening the tarball (for a
    release that cannot be opened)."""
    tag, prov, release = path.name, None, {}
    try:
        found = read_json(path / "release.json")
        release = found if isinstance(found, dict) else {}
        tag = str(found.get("tag") or tag)
    except (ServelabError, AttributeError):
        pass
    try:
        found = read_json(path / "provenance.json")
        prov = found if isinstance(found, dict) else None
    except ServelabError:
        pass
    return tag, prov, release


def _side(
    path: Path, workdir: Path, checked: CheckedRelease | None, release: dict[str, Any]
) -> Side:
    """The release folder `path` as a side: opened (verified, its tarball extracted under
    `workdir`), or, when its caller has checked it (`checked`), the bundle that check extracted,
    not verified again; a release that did not verify is refused with its first failure."""
    if checked is None:
        return open_side(path, workdir, "release")
    if checked.failures or checked.bundle is None:
        raise refusal(path, checked.failures or ["its tarball was not opened"], "release")
    return bundle_side(str(path), "release", checked.bundle, release)


def _open(experiment: str, path: Path, workdir: Path, checked: CheckedRelease | None) -> _Release:
    """Open (verify, unless `checked` says how its check went) and analyse one release; a
    release that cannot be is kept with its error, one line."""
    tag, prov, release = _beside(path)
    rel = _Release(tag, prov, shown=_shown(path))
    made_for = (prov or {}).get("experiment")
    if prov is not None and made_for != experiment:
        rel.error = f"is a release of experiment {made_for!r}, not of {experiment!r}"
        return rel
    try:
        side = _side(path, workdir, checked, release)
        rel.side, rel.provenance = side, side.provenance
        opts = side.analysis
        rel.analysed = analyse(load_dataset(side.root, validity=opts.validity), opts)
        rel.opts = opts
        try:
            rel.host = read_host_speed(side.root)
        except ServelabError as exc:  # a damaged canary: this release's host speed is unknown
            rel.host_error = str(exc).replace(str(side.root), rel.tag)
    except Exception as exc:  # an old or damaged release stays in the history, with why
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # the page names the release as evidence/<experiment>/<tag>, never by an absolute path
        what = what.replace(str(path), _shown(path))
        rel.analysed, rel.error = None, f"cannot be analysed again by this servelab: {what}"
    return rel


def _shown(path: Path) -> str:
    """A release folder as a page names it: its last three parts (evidence/<experiment>/<tag>),
    the same wherever the evidence folder lies."""
    return Path(*path.parts[-3:]).as_posix()


def _release_row(rel: _Release) -> ReleaseRow:
    prov = rel.provenance or {}
    pipe = prov.get("pipeline") if isinstance(prov.get("pipeline"), dict) else {}
    assert isinstance(pipe, dict)
    points = rel.analysed.ds.points if rel.analysed is not None else []
    row: ReleaseRow = {
        "tag": rel.tag,
        "date": prov.get("started"),
        "git_commit": pipe.get("git_commit"),
        # as recorded in provenance.json (absent: version 1, before it was recorded)
        "analysis_version": int(pipe.get("analysis_version") or 1) if prov else None,
        "servelab_version": pipe.get("servelab_version"),
        "vllm_version": prov.get("vllm_version"),
        "host_class": host_class(rel.provenance),
        "points_valid": sum(1 for p in points if p.valid) if rel.analysed else None,
        "points_total": len(points) if rel.analysed else None,
    }
    if rel.error is not None:
        row["error"] = rel.error
    return row


Key = tuple[str, str, str, float]  # metric, server config, axis, level


def _keys(rels: list[_Release]) -> list[Key]:
    """Every (metric, server config, axis, level) measured by an analysed release, metrics in
    METRICS order."""
    found = {
        (sc, a.g.axis, float(c))
        for r in rels
        if (a := r.analysed) is not None
        for sc in a.g.configs
        for c in a.g.levels(sc)
    }
    return [(m, sc, axis, c) for m in METRICS for sc, axis, c in sorted(found)]


def _level(a: Analysed, sc: str, axis: str, level: float) -> int | float | None:
    """The level of `a` that is `level` on `axis` (None when `a` did not measure it)."""
    if a.g.axis != axis:
        return None
    return next((c for c in a.g.levels(sc) if float(c) == level), None)


def _repeats(rel: _Release, key: Key) -> tuple[list[float], int] | None:
    """A point's valid repeats of one metric (by repeat) and how many repeats lost it to a
    validity check; None when the release did not measure the point, or measured too few
    requests to report a percentile `m` at it (Groups.insufficient): the history leaves it
    out."""
    m, sc, axis, level = key
    a = rel.analysed
    c = _level(a, sc, axis, level) if a is not None else None
    if a is None or c is None:
        return None
    values = a.g.values(sc, c, m)
    if not values and a.g.insufficient(sc, c, m):
        return None
    measured = len(a.g.by.get((sc, c), {}))
    return [values[r] for r in sorted(values)], measured - len(values)


def _series(rels: list[_Release]) -> list[Series]:
    out: list[Series] = []
    for key in _keys(rels):
        points: list[SeriesPoint] = []
        for rel in rels:
            got = _repeats(rel, key)
            if got is None:
                continue
            d = describe(got[0])
            ci = None if d.ci95_low is None else [d.ci95_low, d.ci95_high]
            points.append(
                {
                    "tag": rel.tag,
                    "mean": d.mean,
                    "ci95": ci,
                    "n": d.n,
                    "repeats": got[0],
                    "invalid": got[1],
                }
            )
        m, sc, axis, level = _keyed(key)
        out.append(
            {
                "metric": m,
                "server_config": sc,
                "axis": axis,
                "level": level,
                "points": points,
                "change_points": [],  # `_changes`, once the pairs say which are comparable
            }
        )
    return out


def _keyed(key: Key) -> tuple[str, str, str, LevelValue]:
    """A key as the record names it: a concurrency as a whole number."""
    m, sc, axis, level = key
    return m, sc, axis, int(level) if axis == "concurrency" and level.is_integer() else level


def _pair_row(
    key: Key, change: float | None, p_value: float | None, verdict: str | None = None
) -> PairPoint:
    """A point of a pair: what it is of, its change and its test; its verdict where the pair
    is not comparable (else `_judge` gives it)."""
    m, sc, axis, level = _keyed(key)
    row: PairPoint = {
        "metric": m,
        "server_config": sc,
        "axis": axis,
        "level": level,
        "change_pct": change,
        "p_value": p_value,
    }
    if verdict is not None:
        row["verdict"] = verdict
    return row


# What a release may change and the history judges (a reproduction refuses them): the server's
# arguments and configurations, its runtime and vLLM release. A change of a point between two
# releases that differ in one of them, beyond what the host's speed explains, is theirs or the
# code's; the pair names them (`changed`).
UNDER_TEST = (
    "config.server.args",
    "config.server.configs",
    "runtime.lock_sha256",
    "runtime.image_digest",
    "vllm_version",
)


def _changed(prov: ProvenanceDiff | None) -> list[str]:
    """What changed between two releases that the history judges (UNDER_TEST)."""
    return [b for b in prov["blocking"] if b in UNDER_TEST] if prov is not None else []


def _engine(prov: ProvenanceDiff | None) -> list[str]:
    """Every engine setting the two releases' servers resolved differently, configuration by
    configuration, and the configurations a release did not record (servelab.analysis.
    engine_diff, in the provenance diff); one that shapes scheduling and was not pinned also
    makes the pair not comparable (through the diff's blocking)."""
    if prov is None:
        return []
    diff = prov["engine"]
    return [f"{r['server_config']}: {r['text']}" for r in diff["rows"]] + diff["not_recorded"]


def _why_not(
    before: _Release, after: _Release, host: HostComparison, prov: ProvenanceDiff | None
) -> list[str]:
    """Why a verdict between two consecutive releases would mean nothing, one phrase each."""
    broken = [r for r in (before, after) if r.error is not None]
    if broken:
        return [f"{r.tag} {r.error}" for r in broken]
    assert prov is not None
    why = []
    if host["class"] == "differs":
        why.append(
            f"the hosts differ ({host_class(before.provenance)} -> "
            f"{host_class(after.provenance)}) in: {difference_names(host['relevant_differences'])}"
        )
    blocking = [b for b in prov["blocking"] if b not in UNDER_TEST]
    if blocking:
        why.append("the setup differs: " + ", ".join(blocking))
    data = other_dataset(
        (before.provenance or {}).get("dataset"), (after.provenance or {}).get("dataset")
    )
    if data is not None:
        why.append("the datasets differ")
    return why


def _test(before: list[float], after: list[float], opts: AnalysisSection) -> float | None:
    """The p of Welch's test of a point's change from `before` to `after` (None when it
    cannot run: fewer than two repeats a side, or a value that is not positive)."""
    if len(before) < 2 or len(after) < 2:
        return None
    return two_sample(after, before, opts.threshold_pct, opts.alpha).p_value


def _pair_point(key: Key, before: _Release, after: _Release) -> PairPoint:
    """A point's means on both sides, its change and its test (the verdict comes with the
    pair's false discovery control, `_judge`)."""
    b, a = _repeats(before, key), _repeats(after, key)
    bm = describe(b[0]).mean if b else None
    am = describe(a[0]).mean if a else None
    opts = before.opts
    assert opts is not None
    bv, av = (b[0] if b else []), (a[0] if a else [])
    ratio = ratio_ci(av, bv, 0.05)  # its 95% interval
    change = 100.0 * (am / bm - 1.0) if am is not None and bm else None
    row = _pair_row(key, change, _test(bv, av, opts))
    row["before_mean"], row["after_mean"] = bm, am
    row["ratio"] = None if ratio is None else [ratio.value, ratio.low, ratio.high]
    return row


def _gate(before: _Release, after: _Release) -> Gate:
    """The gate of a pair: the earlier release's margin (analysis.equivalence's default where
    its options hold none), and the rerun of the two releases an UNKNOWN names."""
    margin = getattr(before.opts, "margin_pct", None) or DEFAULT_MARGIN_PCT
    rerun = rerun_command(before.shown, after.shown)
    return Gate(float(margin), rerun=rerun, names=(before.tag, after.tag))


def _judge(points: list[PairPoint], before: _Release, after: _Release) -> None:
    """Each point's verdict: Benjamini-Hochberg over the pair's tests at FDR_Q, a discovery
    reaching the practical threshold is a change, and a change is set against the host's
    speed by the gate (analysis.hostspeed.attribute)."""
    opts = before.opts
    assert opts is not None
    host = host_ratio(before.host, after.host)
    gate = _gate(before, after)
    adjusted = benjamini_hochberg([p["p_value"] for p in points], FDR_Q)
    for p, q in zip(points, adjusted, strict=True):
        p["p_adjusted"] = q
        if q is None:
            p["verdict"], p["direction"], p["vs_host_pct"] = INVALID, None, None
            continue
        change = p["change_pct"]
        changed = q <= FDR_Q and change is not None and abs(change) >= opts.threshold_pct
        got = attribute(p["metric"], _ratio(p.get("ratio")), changed, host, gate)
        vs = None if got.vs_host is None else 100.0 * (got.vs_host - 1.0)
        p["verdict"], p["direction"], p["vs_host_pct"] = got.answer, got.direction, vs
        if got.why is not None:
            p["why"] = got.why


def _ratio(r: list[float | None] | None) -> Ratio | None:
    """A point's ratio as the record holds it ([value, low, high]), None without one."""
    if not r:
        return None
    value, low, high = r
    assert value is not None  # only the interval may be missing
    return Ratio(value, low, high)


def _host_speed(before: _Release, after: _Release) -> HostSpeedRecord:
    """The pair's host-speed record: the ratio and its band, or why there is none."""
    why = why_no_ratio(before.host, after.host, (before.tag, after.tag))
    errors = [f"{r.tag}: {r.host_error}" for r in (before, after) if r.host_error]
    if errors:
        why = "; ".join(errors)
    ratio = host_ratio(before.host, after.host) if not errors else None
    return host_speed_json(ratio, why, _gate(before, after))


def _pair(before: _Release, after: _Release) -> Pair:
    host = compare_hosts(before.provenance, after.provenance)
    prov = None  # the two sides' provenance, field by field (both opened: once per pair)
    if before.side is not None and after.side is not None:
        prov = provenance_diff(before.side, after.side, host, (before.tag, after.tag))
    why = _why_not(before, after, host, prov)
    keys = [k for k in _keys([before, after]) if _repeats(before, k) or _repeats(after, k)]
    relevant, other = host["relevant_differences"], host["other_differences"]
    if why:
        points = [_pair_row(k, None, None, NOT_COMPARABLE) for k in keys]
    else:
        points = [_pair_point(k, before, after) for k in keys]
        _judge(points, before, after)
    tested = sum(1 for p in points if p.get("p_adjusted") is not None)
    return {
        "before": before.tag,
        "after": after.tag,
        "comparable": not why,
        "why_not": "; ".join(why) if why else None,
        "changed": _changed(prov),
        "engine": _engine(prov),
        "host": {
            "class": host["class"],
            "relevant_differences": difference_names(relevant) if relevant else None,
            "other_differences": difference_names(other) if other else None,
            # a pair is one line: the differences named in it
            "qualifier": host_qualifier(host)
            + (f": {difference_names(relevant)}" if relevant else ""),
        },
        "host_speed": _host_speed(before, after) if not why else None,
        "fdr": {"method": "Benjamini-Hochberg", "q": FDR_Q, "tests": tested} if not why else None,
        # which way is better: the verdict's thresholds are the earlier release's
        "threshold_pct": before.opts.threshold_pct if before.opts else None,
        "alpha": before.opts.alpha if before.opts else None,
        "points": points,
    }


def _changes(series: list[Series], rels: list[_Release], pairs: list[Pair]) -> None:
    """Each series' change points (site.history_changes), per run of comparable releases."""
    tags = [r.tag for r in rels]
    comparable = [p["comparable"] for p in pairs]
    known = {
        r.tag: Known(r.host, r.shown, r.opts.threshold_pct, _margin(r))
        for r in rels
        if r.opts is not None
    }
    for s in series:
        s["change_points"] = series_changes(s, tags, comparable, known)


def _margin(rel: _Release) -> float:
    """A release's equivalence margin (analysis.equivalence's default where it holds none)."""
    return float(getattr(rel.opts, "margin_pct", None) or DEFAULT_MARGIN_PCT)


def release_history(
    experiment: str,
    releases: list[Path],
    workdir: Path,
    checked: Mapping[Path, CheckedRelease] | None = None,
) -> History:
    """The history of `experiment` over `releases` (release folders, in release order): each
    release opened (verified) under `workdir` and analysed again by this servelab with its own
    recorded analysis options; per metric, server config and level, the points of every
    release (mean, 95% CI, the valid repeats, how many repeats a validity check left out);
    per consecutive pair, whether a verdict means anything and each point's verdict; per
    series, its change points over each run of comparable releases (`change_points`). A release
    that cannot be analysed again stays in `releases` with its `error` and is out of the
    series. Returned as its JSON reads back (sorted keys, floats as servelab.store.jsonio writes
    them): same releases, same bytes.

    `checked` holds, by folder, the releases its caller has already checked
    (site.check.check_release, the bundle it extracted still in place): those are neither
    verified nor extracted again; one whose check failed is not analysed and stays with its
    first failure as the error."""
    checks = checked or {}
    rels = [
        _open(experiment, p, workdir / f"{i:03d}", checks.get(p)) for i, p in enumerate(releases)
    ]
    series, pairs = _series(rels), [_pair(a, b) for a, b in zip(rels, rels[1:], strict=False)]
    _changes(series, rels, pairs)
    out: History = {
        "experiment": experiment,
        "releases": [_release_row(r) for r in rels],
        "metrics": list(METRICS),
        "better": {m: "higher" if m in HIGHER_IS_BETTER else "lower" for m in METRICS},
        "series": series,
        "pairs": pairs,
        "change_point_method": method(),
    }
    result: History = json.loads(dumps(out))
    return result
