"""The record of an experiment's release history (`site.history.release_history`), which the
history page renders (`site.history_view`) and its figures draw (`site.history`)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from servelab.design.level import LevelValue
from servelab.documents.declared import Fdr, HostSpeedRecord


class ReleaseRow(TypedDict):
    """A release of the history: its tag, when it ran, what measured it, its host's class and
    its valid points (None when it cannot be analysed again: `error` says why)."""

    tag: str
    date: str | None
    git_commit: str | None
    analysis_version: int | None
    servelab_version: str | None
    vllm_version: str | None
    host_class: str
    points_valid: int | None
    points_total: int | None
    error: NotRequired[str]


class SeriesPoint(TypedDict):
    """A point of one release in a series: its mean with the 95% CI, the valid repeats, and how
    many repeats a validity check left out."""

    tag: str
    mean: float | None
    ci95: list[float | None] | None
    n: int
    repeats: list[float]
    invalid: int


class Keyed(TypedDict):
    """What a series, or a point of a pair, is of: a metric of a server config at a level."""

    metric: str
    server_config: str
    axis: str
    level: LevelValue


class ChangePointRow(TypedDict):
    """A change point of a series (analysis.changepoints.ChangePoint): the releases either side
    (an excursion: the release before it and the release itself), its kind ("step" or
    "excursion"), the change of the level in % as measured, that change over the host ratio's
    in % (None without one), whose change it is (an answer of analysis.hostspeed), beyond the
    host's speed which way ("better" or "worse"), and for UNKNOWN why, with the rerun
    command."""

    before: str
    after: str
    kind: str
    change_pct: float
    vs_host_pct: float | None
    answer: str
    direction: str | None
    why: str | None


class ChangeRun(TypedDict):
    """A run of comparable consecutive releases of a series, its answer (an answer of
    analysis.changepoints: changed, no change point, too few releases, ...), the spread of its
    releases' levels beyond their repeats the fit found (sd of the logs), and its change
    points."""

    releases: list[str]
    answer: str
    between_sd: float
    change_points: list[ChangePointRow]


class ChangeMethod(TypedDict):
    """How the change points were found: the method, its penalty per step (squared standard
    errors), the smallest within-release spread a weight assumes, and the fewest releases of
    a run it judges."""

    method: str
    penalty: float
    sd_floor: float
    min_releases: int


class Series(Keyed):
    """A metric of a server config at a level across the releases that measured it, and its
    change points per run of comparable releases."""

    points: list[SeriesPoint]
    change_points: list[ChangeRun]


class PairPoint(Keyed):
    """A point between two consecutive releases: the means, the change with its ratio and
    test, and its verdict (only the change, test and verdict where the pair is not
    comparable)."""

    before_mean: NotRequired[float | None]
    after_mean: NotRequired[float | None]
    change_pct: float | None
    p_value: float | None
    ratio: NotRequired[list[float | None] | None]
    p_adjusted: NotRequired[float | None]
    verdict: NotRequired[str]
    direction: NotRequired[str | None]
    vs_host_pct: NotRequired[float | None]
    # for `unknown: the canary cannot tell ...`: why, and the rerun command that settles it
    why: NotRequired[str]


# the hosts of a pair: the class, the differing facts by name (None: none), the verdict's
# words (`class` is a keyword: the functional syntax)
PairHost = TypedDict(
    "PairHost",
    {
        "class": str,
        "relevant_differences": str | None,
        "other_differences": str | None,
        "qualifier": str,
    },
)


class Pair(TypedDict):
    """Two consecutive releases: whether a verdict means anything (why not), their hosts and
    host speed, the false discovery control, the earlier release's thresholds, the points."""

    before: str
    after: str
    comparable: bool
    why_not: str | None
    # what changed that the history judges (site.history.UNDER_TEST: server arguments, runtime,
    # vLLM release); a change beyond the host's speed is theirs or the code's
    changed: list[str]
    # the engine settings the two releases' servers resolved differently, and the
    # configurations a release did not record (servelab.analysis.engine_diff)
    engine: list[str]
    host: PairHost
    host_speed: HostSpeedRecord | None
    fdr: Fdr | None
    threshold_pct: float | None
    alpha: float | None
    points: list[PairPoint]


class History(TypedDict):
    """The history of an experiment: its releases, the metrics shown (and which way is better),
    every series, every pair of consecutive releases, and how the series' change points were
    found."""

    experiment: str
    releases: list[ReleaseRow]
    metrics: list[str]
    better: dict[str, str]
    series: list[Series]
    pairs: list[Pair]
    change_point_method: ChangeMethod
