"""Validity checks run on every measured point (docs/analysis.md#validity).

The package: flags (Flag, Check, statuses), facts (what a check reads, from either raw layout),
measurement and pitfalls (the checks, by family), catalog (CHECKS, running them), attempts (the
host checks, which attempt of a re-measured point is used), results (validity.json, the
report's counts, the end-of-run line).

A check is a pure function of what was recorded for one point (its requests, its duration,
its telemetry summary) and the thresholds of the config's `analysis.validity` section. It
returns a Flag: passed, failed, noted (recorded, never excluding) or not checked (the data it
needs was not recorded). A failed check removes the metrics it affects from every statistic:
`latency` (TTFT, TPOT and ITL metrics: burst delivery leaves E2EL and throughput intact),
`ttft` or `itl` alone, `ttft_e2el` (TTFT and E2EL: a latency trend), or `all`. The raw data
stays as it was. docs/pitfalls.md maps each check to the measurement mistake it catches.

To add a check: write a function (PointFacts, ValiditySection) -> Flag, add the facts it reads
to PointFacts (and to both builders), its threshold to the schema (analysis.validity) and to
servelab.experiment.ValiditySection, and an entry to CHECKS.
"""

from servelab.analysis.validity.attempts import (
    HOST_CHECKS,
    Choice,
    choose,
    disturbance,
    disturbed,
    host_flags,
    use_attempt,
    use_attempts,
)
from servelab.analysis.validity.catalog import (
    ALL_CHECKS,
    BY_NAME,
    CHECKS,
    OPEN_LOOP_CHECKS,
    check_point,
    checks_for,
    evaluate,
    failed,
    removing,
)
from servelab.analysis.validity.facts import (
    PointFacts,
    RequestFacts,
    facts_from_bench,
    facts_from_records,
)
from servelab.analysis.validity.flags import (
    AFFECTS_WORDS,
    ALL,
    FAILED,
    ITL,
    LATENCY,
    NONE,
    NOT_CHECKED,
    NOTED,
    PASSED,
    SECTION,
    STATUSES,
    TTFT,
    TTFT_E2EL,
    Check,
    Flag,
    thresholds_json,
)
from servelab.analysis.validity.pitfalls import tokens_per_chunk_allowed
from servelab.analysis.validity.results import (
    HOST_SPEED_WORDS,
    PointFlags,
    axis_of,
    counts,
    host_speed_json,
    level_name,
    point_name,
    summary_line,
    validity_json,
)

__all__ = [
    "AFFECTS_WORDS",
    "ALL",
    "ALL_CHECKS",
    "BY_NAME",
    "CHECKS",
    "FAILED",
    "ITL",
    "LATENCY",
    "NONE",
    "NOTED",
    "NOT_CHECKED",
    "OPEN_LOOP_CHECKS",
    "PASSED",
    "SECTION",
    "STATUSES",
    "TTFT",
    "TTFT_E2EL",
    "Check",
    "Choice",
    "Flag",
    "HOST_CHECKS",
    "PointFacts",
    "PointFlags",
    "RequestFacts",
    "axis_of",
    "check_point",
    "checks_for",
    "choose",
    "disturbance",
    "disturbed",
    "host_flags",
    "use_attempt",
    "use_attempts",
    "level_name",
    "counts",
    "evaluate",
    "facts_from_bench",
    "facts_from_records",
    "failed",
    "point_name",
    "removing",
    "summary_line",
    "thresholds_json",
    "tokens_per_chunk_allowed",
    "HOST_SPEED_WORDS",
    "host_speed_json",
    "validity_json",
]
