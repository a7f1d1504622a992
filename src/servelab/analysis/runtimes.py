"""Runtimes compared within one run: is configuration B, on its own runtime (another vLLM
release, server.configs[].runtime), faster or slower than A here?

Where the run's server configurations ran on more than one runtime (launch.json's
`runtime_lock_sha256` or `runtime_image_digest` differ), the first configuration is the
reference and every configuration on another runtime is compared with it, at every level
both measured, round by round: B's round r against A's round r, the two measured on fresh
launches in turn in the same round of an interleaved plan (sweep.repeats.interleave).

Each (level, metric) is answered in three words (servelab.analysis.samehost, the same-host
comparison's own function): SAME, DIFFERENT (faster or slower) or UNKNOWN at the equivalence
margin `analysis.margin_pct`, each row at alpha / (decisions x looks), its interval at 1 - 2 x
that (two one-sided tests; Bonferroni over every pair x level x metric and over the looks the
sequential plan allows: `equivalence.family_alpha`), so that the chance of a wrong SAME or
DIFFERENT anywhere in the section stays under `analysis.alpha`. The answer and the section's
headline ("Is B slower than A?") come from those words. Beside them, for information only,
the paired t-test's p of each row at `analysis.alpha` (unadjusted: 9 such tests at 0.05 call
something in about 1 run in 3 where nothing differs).

Without `interleave` each side's rounds share one launch: they are not independent replicates
of the two runtimes (pseudo-replication), so every row is UNKNOWN with that reason (and the
config validation refuses such an experiment: env.config_runtime). A run on one runtime has
no comparison.

runtimes.json format 2 (Analysis.runtimes): format 1's keys keep their names; `answer` is
the word ("SAME", "DIFFERENT (slower)", "UNKNOWN"), `ratio`, `ci_low` and `ci_high` are B / A
with the family interval; the words' own fields (`word`, `direction`, `speed`, `low`, `high`,
`rounds_needed`, `why`) and the family's (`method`, `margin_pct`, `decisions`, `looks`,
`interval_alpha`, `interleaved`) are added; each pair's `same_outputs`, where either side
recorded its outputs' token ids (servelab.analysis.outputs), says whether the two runtimes gave
the same answers, and the headline says so where too many differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servelab.analysis.dataset import Dataset
from servelab.analysis.engine_diff import engine_text, pair_engine
from servelab.analysis.equivalence import DIFFERENT, METHOD as WORDS_METHOD, SAME, SLOWER, UNKNOWN
from servelab.analysis.groups import Groups
from servelab.analysis.outputs import OutputsAsk, outputs_line, with_outputs
from servelab.analysis.samehost import (
    HIGHER_IS_FASTER,
    METRICS,
    NOT_INTERLEAVED,
    Plan,
    family_text,
    interleaved,
    interval_text,
    same_host,
    word_text,
)
from servelab.analysis.stats import paired
from servelab.documents.declared import (
    ComparedJson,
    RowJson,
    RuntimeIdJson,
    RuntimesJson,
    RuntimesPair,
)
from servelab.experiment import AnalysisSection, ComparePair

FORMAT_VERSION = 2
METHOD = f"{WORDS_METHOD}; p: the paired t-test at alpha, unadjusted, for information"


def runtime_ids(ds: Dataset, configs: list[str]) -> list[RuntimeIdJson]:
    """Each configuration's runtime (from its launch.json) and vLLM release (its capacity
    facts), as the dataset read them: none where the file is missing or damaged."""
    out: list[RuntimeIdJson] = []
    for sc in configs:
        launch = ds.launches.get(sc)
        facts = ds.capacity.get(sc) or {}  # capacity.json (CapacityRecord.vllm_version's rule)
        version = facts.get("version_endpoint") or facts.get("version")
        lock = launch.get("runtime_lock_sha256") if launch else None
        digest = launch.get("runtime_image_digest") if launch else None
        runtime = f"lock:{lock}" if lock else f"image:{digest}" if digest else None
        out.append(
            {
                "server_config": sc,
                "runtime": runtime,
                "vllm_version": version if isinstance(version, str) else None,
            }
        )
    return out


def runtime_pairs(ids: Sequence[RuntimeIdJson]) -> list[ComparePair]:
    """The pairs "Runtimes compared" asks: the first configuration against every one on
    another runtime (none when every configuration ran on one)."""
    if len({i["runtime"] for i in ids}) < 2:
        return []
    ref = ids[0]
    return [
        ComparePair(ref["server_config"], o["server_config"], METRICS)
        for o in ids[1:]
        if o["runtime"] != ref["runtime"]
    ]


def _b_over_a(r: RowJson, metric: str) -> tuple[float | None, float | None, float | None]:
    """The words' speed interval as B / A of the metric itself (a latency's is A / B)."""
    speed, low, high = r["speed"], r["low"], r["high"]
    if speed is None or low is None or high is None:
        return None, None, None
    if metric in HIGHER_IS_FASTER:
        return speed, low, high
    return 1.0 / speed, 1.0 / high, 1.0 / low


def _row(g: Groups, a: str, b: str, r: RowJson, opts: AnalysisSection) -> ComparedJson:
    """One row: the word of the family, and the paired test's p beside it."""
    level, metric = r["level"], r["metric"]
    vb, va = g.pair(b, level, a, level, metric)
    ratio, low, high = _b_over_a(r, metric)
    label = f"{r['word']} ({r['direction']})" if r["direction"] else r["word"]
    return {
        "level": level,
        "metric": metric,
        "n": r["n"],
        "ratio": ratio,
        "ci_low": low,
        "ci_high": high,
        "p_value": paired(vb, va, opts.threshold_pct, opts.alpha).p_value,
        "answer": label,
        "word": r["word"],
        "direction": r["direction"],
        "speed": r["speed"],
        "low": r["low"],
        "high": r["high"],
        "rounds_needed": r["rounds_needed"],
        "why": r["why"],
    }


def runtimes_compared(
    g: Groups, ds: Dataset, opts: AnalysisSection, outputs: OutputsAsk | None = None
) -> RuntimesJson | None:
    """The comparison of the run's runtimes (None: every configuration ran on one);
    `outputs`: the run's recorded completions, each pair's compared (None: not read)."""
    ids = runtime_ids(ds, list(g.configs))
    asked = runtime_pairs(ids)
    if not asked:
        return None
    ref = ids[0]
    others = [i for i in ids[1:] if i["runtime"] != ref["runtime"]]
    sides = sorted({ref["server_config"], *(o["server_config"] for o in others)})
    plan = Plan(interleaved=interleaved(ds, sides))
    words = same_host(ds, asked, opts.margin_pct, opts.alpha, plan)
    assert words is not None  # `asked` holds one pair at least: B on another runtime than A
    pairs: list[RuntimesPair] = []
    for other, found in zip(others, words["pairs"], strict=True):
        a, b = found["a"], found["b"]
        rows = [_row(g, a, b, r, opts) for r in found["rows"]]
        pair: RuntimesPair = {
            "a": ref,
            "b": other,
            "rows": rows,
            "engine": pair_engine(ds.launches, a, b),
        }
        block = outputs.block(a, b) if outputs is not None else None
        if block is not None:
            pair["same_outputs"] = block
        pairs.append(pair)
    return {
        "format_version": FORMAT_VERSION,
        "axis": g.axis,
        "method": METHOD,
        "alpha": opts.alpha,
        "threshold_pct": opts.threshold_pct,
        "margin_pct": words["margin_pct"],
        "decisions": words["decisions"],
        "looks": words["looks"],
        "interval_alpha": words["interval_alpha"],
        "interleaved": words["interleaved"],
        "pairs": pairs,
    }


def _release(i: RuntimeIdJson) -> str:
    version = f"vLLM {i['vllm_version']}" if i["vllm_version"] else "vLLM release not reported"
    return f"{i['server_config']} ({version})"


def _where(rows: Sequence[ComparedJson], level_name: Mapping[Any, str]) -> str:
    """'output_throughput at c=8; mean_ttft_ms at c=1, c=4': the rows by metric."""
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["metric"], []).append(level_name[r["level"]])
    return "; ".join(f"{m} at {', '.join(levels)}" for m, levels in by.items())


def headline(rows: Sequence[ComparedJson], margin_pct: float, level_name: Mapping[Any, str]) -> str:
    """The answer to "Is B slower than A?" from the rows' words: Yes (a row DIFFERENT
    (slower)), No (every row SAME or DIFFERENT (faster)), Unknown otherwise: an UNKNOWN row may
    hide a slowdown."""
    m = f"{margin_pct:g}%"
    slower = [r for r in rows if r["word"] == DIFFERENT and r["direction"] == SLOWER]
    faster = [r for r in rows if r["word"] == DIFFERENT and r["direction"] != SLOWER]
    unknown = [r for r in rows if r["word"] == UNKNOWN]
    same = [r for r in rows if r["word"] == SAME]
    parts = [f"slower by more than {m} in {_where(slower, level_name)}"] if slower else []
    parts += [f"faster by more than {m} in {_where(faster, level_name)}"] if faster else []
    if same:
        where = "every level and metric" if len(same) == len(rows) else f"{len(same)} more"
        parts.append(f"the same within {m} at {where}")
    if unknown:
        why = {r["why"] for r in unknown}
        reason = f" ({NOT_INTERLEAVED})" if why == {NOT_INTERLEAVED} else ""
        parts.append(f"{len(unknown)} of {len(rows)} answers UNKNOWN{reason}")
    lead = "Yes" if slower else "Unknown" if unknown or not rows else "No"
    return f"{lead}: " + ("; ".join(parts) if parts else "no level both measured") + "."


def runtimes_section(doc: RuntimesJson | None, level_name: dict[int | float, str]) -> list[str]:
    """The report's "Runtimes compared" section (none for a run on one runtime)."""
    if doc is None:
        return []
    lines = [
        "",
        "## Runtimes compared",
        "",
        f"Each configuration on another runtime against the first, round by round, in three "
        f"words: SAME where B / A's interval lies within the {doc['margin_pct']:g}% margin, "
        f"DIFFERENT where it lies wholly outside, UNKNOWN otherwise ({family_text(doc)}). "
        f"B / A is the metric's own ratio (a latency above 1: B is "
        f"slower). p is the paired t-test's at alpha {doc['alpha']:g}, unadjusted: for "
        f"information, not the answer.",
    ]
    if not doc["interleaved"]:
        lines += ["", f"Every row is UNKNOWN: {NOT_INTERLEAVED}."]
    for pair in doc["pairs"]:
        a, b = _release(pair["a"]), _release(pair["b"])
        lines += [
            "",
            f"### Is {b} slower than {a}?",
            "",
            with_outputs(
                headline(pair["rows"], doc["margin_pct"], level_name), pair.get("same_outputs")
            ),
            "",
            outputs_line(pair.get("same_outputs")),
            *engine_text(pair.get("engine")),
            "",
            "| level | metric | rounds | B / A [interval] | p (unadjusted) | answer |",
            "|---|---|---|---|---|---|",
        ]
        for r in pair["rows"]:
            p = "" if r["p_value"] is None else f"{r['p_value']:.3g}"
            answer = word_text(r["word"], r["direction"], r["rounds_needed"])
            if r["why"] and r["why"] != NOT_INTERLEAVED:
                answer += f" ({r['why']})"
            lines.append(
                f"| {level_name[r['level']]} | {r['metric']} | {r['n']} "
                f"| {interval_text(r['ratio'], r['ci_low'], r['ci_high'])} "
                f"| {p} | {answer} |"
            )
    return lines
