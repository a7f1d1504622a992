"""The stopping rule of sequential rounds (servelab.design.stopping), simulated with the
product's own loop over the looks (stopping.run_looks, which the sweep and the analysis run).

a. Error rate under no true effect: the share of simulated studies in which a question gets a
   verdict (holds or fails) although its two points have the same expectation, for the rule
   (each pair tested on its own log ratios, alpha spent over the looks) at three plans, for a
   naive rule that tests at the full alpha at every look, and for the rejected rule that pooled
   the variance over every point of the metric.
b. Time to verdict: sequential rounds (min 2 and min 3, max 6) against fixed 3 and fixed 6
   repeats, on studies shaped like the two published seeds, the default experiment and a close
   call; with the launch time of the plan and without it.

Run: python benchmarks/bench_sequential.py [--studies 10000] [--seed 0] [--json PATH]
Pure CPU, numpy, scipy and servelab only; the same seed prints the same numbers.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from servelab.analysis.claims import ALIASES
from servelab.analysis.rounds import open_claims
from servelab.claims_syntax import CMP
from servelab.config import load_yaml
from servelab.design.stopping import (
    OPEN,
    Entry,
    StoppingRule,
    claim_verdict,
    is_open,
    look_evidence,
    run_looks,
    sequential_test,
)

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ROOT / "evidence" / "quickstart-cpu"
LATEST = RELEASES / "v6"
METRICS = ("output_throughput", "mean_ttft_ms")
ALPHA = 0.05
REFERENCE = 200_000  # studies of the one-pair reference rate of part a
CHECKED = 100  # studies per case whose verdicts are checked against stopping.run_looks

Cell = tuple[str, int]  # (server config, concurrency)
PerCell = dict[str, dict[Cell, float]]  # metric -> cell -> value
# metric -> cell -> round -> value: one simulated study, as the looks read it
Tables = Mapping[str, Mapping[Cell, Mapping[int, float]]]


@dataclass(frozen=True)
class Question:
    """One paired comparison a claim asks: is metric[a] op factor * metric[b]?"""

    name: str  # the claim
    metric: str
    a: Cell
    b: Cell
    op: str  # ">" | "<"
    factor: float = 1.0
    threshold_pct: float = 0.0


# ---------------------------------------------------------------- the product's looks


def comparison_at(q: Question, tables: Tables, rule: StoppingRule, k: int) -> Entry:
    """The question's entry at the look after round k, as analysis.claims makes a comparison's
    (verdict, `evidence.sequential`), tested on the rounds 1..k both points have."""
    cells = tables.get(q.metric, {})
    va, vb = cells.get(q.a, {}), cells.get(q.b, {})
    common = [r for r in sorted(set(va) & set(vb)) if r <= k]
    test = sequential_test(
        [va[r] for r in common],
        [q.factor * vb[r] for r in common],
        rule.look_alpha(k),
        q.threshold_pct,
    )
    verdict = claim_verdict(q.op, test.verdict)
    return {"claim": q.name, "verdict": verdict, "evidence": {"sequential": look_evidence(k, test)}}


def study_looks(
    questions: Sequence[Question], tables: Tables, rule: StoppingRule, rounds: int
) -> list[list[Entry]]:
    """Every look of one study from `min` to `rounds`, by the product's loop (run_looks)."""

    def look(k: int) -> list[Entry]:
        return [comparison_at(q, tables, rule, k) for q in questions]

    return run_looks(rule, rounds, look)


def decision(entry: Entry) -> tuple[str, int | None]:
    """(holds | fails | open, the round of the look that decided it or None)."""
    if is_open(entry):
        return OPEN, None
    return entry["verdict"], int(entry["evidence"]["sequential"]["round"])


# ---------------------------------------------------------------- inputs read from the repo


def read_summary(path: Path) -> dict[str, dict[Cell, tuple[float, float]]]:
    """metric -> cell -> (mean, cv_pct) for the two metrics the claims use."""
    out: dict[str, dict[Cell, tuple[float, float]]] = {m: {} for m in METRICS}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["metric"] in out and row["cv_pct"]:
                cell = (row["server_config"], int(row["concurrency"]))
                out[row["metric"]][cell] = (float(row["mean"]), float(row["cv_pct"]))
    return out


def measured_cvs() -> tuple[PerCell, list[str]]:
    """The median CV (as a fraction) per cell across every release's summary.csv."""
    paths = sorted(RELEASES.glob("v*/tables/summary.csv"))
    if not paths:
        sys.exit(f"{RELEASES}: no v*/tables/summary.csv; run from a full checkout of servelab")
    per: dict[str, dict[Cell, list[float]]] = {m: {} for m in METRICS}
    for p in paths:
        for m, cells in read_summary(p).items():
            for cell, (_, cv) in cells.items():
                per[m].setdefault(cell, []).append(cv / 100.0)
    cvs = {m: {c: statistics.median(v) for c, v in cells.items()} for m, cells in per.items()}
    return cvs, [p.parent.parent.name for p in paths]


def latest_means() -> tuple[PerCell, PerCell]:
    s = read_summary(LATEST / "tables" / "summary.csv")
    means = {m: {c: mv[0] for c, mv in cells.items()} for m, cells in s.items()}
    cvs = {m: {c: mv[1] / 100.0 for c, mv in cells.items()} for m, cells in s.items()}
    return means, cvs


def latest_durations() -> dict[Cell, float]:
    """Mean measured duration (s) of each point of the latest release."""
    per: dict[Cell, list[float]] = {}
    with (LATEST / "tables" / "points.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            cell = (row["server_config"], int(row["concurrency"]))
            per.setdefault(cell, []).append(float(row["duration"]))
    return {c: statistics.mean(v) for c, v in per.items()}


def question(claim: str, threshold_pct: float) -> Question | None:
    """A comparison claim (both points named by config= and c=) as a question, None for any
    other claim; without a factor it gets `threshold_pct`, as the analysis does."""
    m = CMP.match(claim)
    if not m:
        return None
    ma, sel_a, op, factor, _, sel_b = m.groups()

    def cell(sel: str) -> Cell:
        parts = dict(p.strip().split("=", 1) for p in sel.split(","))
        return (parts["config"].strip(), int(parts["c"]))

    return Question(
        claim.strip(),
        ALIASES.get(ma, ma),
        cell(sel_a),
        cell(sel_b),
        op,
        float(factor) if factor else 1.0,
        0.0 if factor else threshold_pct,
    )


def config_claims(threshold_pct: float | None) -> list[Question]:
    """The comparison claims of config/config.yaml as questions (other claims skipped); a claim
    without a factor gets `threshold_pct` (the analysis's default when None)."""
    cfg = load_yaml(ROOT / "config" / "config.yaml")
    default_thr = float(cfg["analysis"].get("threshold_pct", 2.0))
    thr = default_thr if threshold_pct is None else threshold_pct
    found = (question(claim, thr) for claim in cfg["analysis"]["claims"])
    return [q for q in found if q is not None]


def adjacent_questions(cells: Sequence[Cell]) -> list[Question]:
    """Every pair of adjacent concurrency levels of each config, both metrics."""
    out = []
    for metric in METRICS:
        for config in sorted({c for c, _ in cells}):
            levels = sorted(lv for c, lv in cells if c == config)
            for lo, hi in zip(levels, levels[1:], strict=False):
                out.append(
                    Question(
                        f"{metric}[{config}] c{hi} vs c{lo}",
                        metric,
                        (config, hi),
                        (config, lo),
                        ">",
                    )
                )
    return out


# ---------------------------------------------------------------- simulation

Arrays = dict[str, tuple[list[Cell], np.ndarray]]  # metric -> (cells, value[study, cell, round])


def simulate(
    rng: np.random.Generator,
    studies: int,
    rounds: int,
    medians: PerCell,
    cvs: PerCell,
    round_sd: float = 0.0,
) -> Arrays:
    """Log-normal values (median as given, sigma from the cell's CV) per cell and round, times
    a per-round factor exp(N(0, round_sd)) common to every cell of that round."""
    arrays: Arrays = {}
    shared = rng.normal(0.0, round_sd, (studies, 1, rounds)) if round_sd else 0.0
    for metric in sorted(medians):
        cells = sorted(medians[metric])
        mu = np.log([medians[metric][c] for c in cells])[None, :, None]
        sigma = np.sqrt(np.log1p(np.square([cvs[metric][c] for c in cells])))[None, :, None]
        z = rng.standard_normal((studies, len(cells), rounds))
        arrays[metric] = (cells, np.exp(mu + sigma * z + shared))
    return arrays


def study_tables(arrays: Arrays, s: int) -> Tables:
    """Study s as the tables the looks read."""
    return {
        m: {c: {r + 1: float(x) for r, x in enumerate(v[s, i])} for i, c in enumerate(cells)}
        for m, (cells, v) in arrays.items()
    }


def log_ratios(arrays: Arrays, q: Question) -> np.ndarray:
    """log(a / (factor * b)) per study and round."""
    cells, v = arrays[q.metric]
    d: np.ndarray = np.log(v[:, cells.index(q.a)]) - np.log(q.factor * v[:, cells.index(q.b)])
    return d


def own_p(d: np.ndarray, k: int) -> np.ndarray:
    """stopping.sequential_test's p-value on rounds 1..k, every study at once: a paired t-test
    on the pair's own log ratios, k - 1 degrees of freedom."""
    x = d[:, :k]
    mean = x.mean(axis=1)
    se = x.std(axis=1, ddof=1) / math.sqrt(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2.0 * sps.t.sf(np.abs(mean / se), k - 1)
    return np.where(se == 0.0, np.where(mean != 0.0, 0.0, 1.0), p)


def pooled_p(logs: np.ndarray, d: np.ndarray, k: int) -> np.ndarray:
    """The rejected rule's p-value on rounds 1..k: the residual mean square of the log
    cells x rounds table (rounds as blocks), (cells - 1)(k - 1) degrees of freedom, or the
    pair's own per-point variance var(d) / 2 where that is larger."""
    y = logs[:, :, :k]
    resid = (
        y
        - y.mean(axis=2, keepdims=True)
        - y.mean(axis=1, keepdims=True)
        + y.mean(axis=(1, 2))[:, None, None]
    )
    df = (y.shape[1] - 1) * (k - 1)
    x = d[:, :k]
    var = np.maximum((resid**2).sum(axis=(1, 2)) / df, x.var(axis=1, ddof=1) / 2.0)
    p: np.ndarray = 2.0 * sps.t.sf(np.abs(x.mean(axis=1)) / np.sqrt(2.0 * var / k), df)
    return p


@dataclass(frozen=True)
class Rule:
    name: str
    lo: int
    hi: int
    test: str  # "own" (stopping's test) | "pooled" (the rejected one)
    spend: bool  # alpha / looks at each look (stopping's rule); False: the full alpha

    def look_alpha(self, k: int) -> float:
        if not self.lo <= k <= self.hi:
            return 0.0
        return StoppingRule(self.lo, self.hi, ALPHA).look_alpha(k) if self.spend else ALPHA


RULES = [
    Rule("own 2-6", 2, 6, "own", True),
    Rule("own 3-6", 3, 6, "own", True),
    Rule("own 3-10", 3, 10, "own", True),
    Rule("naive 2-6", 2, 6, "own", False),
    Rule("pooled 2-6 (rejected)", 2, 6, "pooled", True),
]


def verdicts(
    arrays: Arrays, q: Question, rule: Rule, p_by_look: Mapping[int, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(deciding round, 0 while open; holds) per study: the first look in lo..hi where the test
    is significant at that look's alpha and reaches the threshold; the verdict then stays."""
    d = log_ratios(arrays, q)
    decided = np.zeros(d.shape[0], dtype=np.int64)
    holds = np.zeros(d.shape[0], dtype=bool)
    for k in range(rule.lo, rule.hi + 1):
        mean = d[:, :k].mean(axis=1)
        big = np.abs(100.0 * np.expm1(mean)) >= q.threshold_pct
        hit = (decided == 0) & (p_by_look[k] < rule.look_alpha(k)) & big
        decided[hit] = k
        holds[hit] = (mean[hit] > 0) == (q.op == ">")
    return decided, holds


def p_values(arrays: Arrays, q: Question, test: str, kmax: int) -> dict[int, np.ndarray]:
    d = log_ratios(arrays, q)
    if test == "own":
        return {k: own_p(d, k) for k in range(2, kmax + 1)}
    logs = np.log(arrays[q.metric][1])
    return {k: pooled_p(logs, d, k) for k in range(2, kmax + 1)}


def check_against_looks(
    arrays: Arrays,
    questions: Sequence[Question],
    rule: Rule,
    got: Sequence[tuple[np.ndarray, np.ndarray]],
    studies: int,
) -> None:
    """The vectorized verdicts of the own-variance rule against the product's looks
    (stopping.run_looks) themselves."""
    srule = StoppingRule(rule.lo, rule.hi, ALPHA)
    for s in range(studies):
        final = study_looks(questions, study_tables(arrays, s), srule, rule.hi)[-1]
        ref = [decision(e) for e in final]
        mine = [
            (OPEN, None) if dec[s] == 0 else ("holds" if hold[s] else "fails", int(dec[s]))
            for dec, hold in got
        ]
        if ref != mine:
            sys.exit(f"bench_sequential: {rule.name} study {s}: {mine} differ from the looks {ref}")


# ---------------------------------------------------------------- a. error rate under the null


def null_medians(
    cells_by_metric: Mapping[str, Sequence[Cell]], claims: Sequence[Question]
) -> PerCell:
    """Medians under which every claim and every adjacent pair has no effect: equal within a
    config, and across configs in the ratio a claim's factor names."""
    med: PerCell = {m: {c: 1.0 for c in cells} for m, cells in cells_by_metric.items()}
    for q in claims:
        if q.a[0] != q.b[0]:
            for c in med[q.metric]:
                if c[0] == q.a[0]:
                    med[q.metric][c] = q.factor * med[q.metric][q.b]
    for q in claims:  # every claim's null holds
        ratio = med[q.metric][q.a] / (q.factor * med[q.metric][q.b])
        assert abs(ratio - 1.0) < 1e-12, q.name
    return med


def part_a(studies: int, seed: int) -> dict[str, Any]:
    cvs, releases = measured_cvs()
    cells = {m: sorted(cvs[m]) for m in METRICS}
    claims = config_claims(threshold_pct=0.0)
    adjacent = adjacent_questions(cells["output_throughput"])
    med = null_medians(cells, claims)
    all_cv = [v for m in METRICS for v in cvs[m].values()]
    median_cv = statistics.median(all_cv)
    flat = {m: {c: median_cv for c in cells[m]} for m in METRICS}
    variants = [
        ("equal CV", flat, 0.0),
        ("per-cell CV", cvs, 0.0),
        ("per-cell CV + round offset", cvs, median_cv / 2.0),
    ]
    print(
        f"a. no true effect: {studies} studies per variant, CV per cell = median over "
        f"{', '.join(releases)} (median over cells {100 * median_cv:.1f}%, "
        f"range {100 * min(all_cv):.1f}-{100 * max(all_cv):.1f}%)",
        flush=True,
    )
    result: dict[str, Any] = {
        "releases": releases,
        "cv_pct": {
            m: {f"{c[0]},c={c[1]}": round(100 * v, 2) for c, v in cvs[m].items()} for m in METRICS
        },
        "median_cv_pct": 100 * median_cv,
        "rules": {
            r.name: {"min": r.lo, "max": r.hi, "test": r.test, "spend": r.spend} for r in RULES
        },
        "variants": {},
    }
    kmax = max(r.hi for r in RULES)
    for vi, (vname, vcvs, round_sd) in enumerate(variants):
        t0 = time.perf_counter()
        arrays = simulate(np.random.default_rng([seed, 1, vi]), studies, kmax, med, vcvs, round_sd)
        rows: dict[str, Any] = {}
        for sname, qs in (("claims", claims), ("adjacent", adjacent)):
            pv = {t: [p_values(arrays, q, t, kmax) for q in qs] for t in ("own", "pooled")}
            for rule in RULES:
                got = [verdicts(arrays, q, rule, pv[rule.test][i]) for i, q in enumerate(qs)]
                if rule.test == "own" and rule.spend:
                    check_against_looks(arrays, qs, rule, got, min(CHECKED, studies))
                wrong = np.stack([dec != 0 for dec, _ in got], axis=1)
                rows[f"{sname}/{rule.name}"] = {
                    "any_wrong": float(wrong.any(axis=1).mean()),
                    "per_question": {q.name: float(wrong[:, i].mean()) for i, q in enumerate(qs)},
                }
        result["variants"][vname] = {"round_sd_pct": 100 * round_sd, "rates": rows}
        print(f"  {vname}: {time.perf_counter() - t0:.1f} s", flush=True)
    result["questions"] = {
        "claims": [q.name for q in claims],
        "adjacent": [q.name for q in adjacent],
    }
    # the own-variance test sees only d / sd(d), standard normal under no effect whatever the
    # two cells' noise: one rate per rule, here with a tighter Monte Carlo error
    d = np.random.default_rng([seed, 3]).standard_normal((REFERENCE, kmax))
    result["one_pair_reference"] = {}
    for rule in RULES:
        if rule.test == "own":
            hit = np.zeros(REFERENCE, dtype=bool)
            for k in range(rule.lo, rule.hi + 1):
                hit |= own_p(d, k) < rule.look_alpha(k)
            result["one_pair_reference"][rule.name] = float(hit.mean())
    return result


def print_a(res: dict[str, Any], studies: int) -> None:
    se = math.sqrt(ALPHA * (1 - ALPHA) / studies)
    names = [r.name for r in RULES]
    head = " ".join(f"{n:>22}" for n in names)
    print(
        f"\nShare of studies with any wrong verdict (alpha {ALPHA}; Monte Carlo se at 5%: {se:.4f})"
    )
    print(f"{'noise':<28} {'questions':<14} {head}")
    for vname, v in res["variants"].items():
        for sname in ("claims", "adjacent"):
            label = f"{sname} ({len(res['questions'][sname])})"
            row = [v["rates"][f"{sname}/{n}"]["any_wrong"] for n in names]
            print(f"{vname:<28} {label:<14} " + " ".join(f"{x:>22.4f}" for x in row))
    for vname in ("per-cell CV", "per-cell CV + round offset"):
        print(f"\nPer question (claims), {vname}:")
        v = res["variants"][vname]["rates"]
        for q in res["questions"]["claims"]:
            row = [v[f"claims/{n}"]["per_question"][q] for n in names]
            print(f"  {q:<60} " + " ".join(f"{x:.4f}" for x in row))
    print("\nWorst single question among the adjacent pairs, per variant (rate, then the pair):")
    over = []
    for vname, vv in res["variants"].items():
        print(f"  {vname}")
        for n in names:
            pq = vv["rates"][f"adjacent/{n}"]["per_question"]
            pq_claims = vv["rates"][f"claims/{n}"]["per_question"]
            worst = max(pq, key=lambda q: pq[q])
            print(f"    {n:<22} {pq[worst]:.4f}  {worst}")
            if n.startswith("own") and max(*pq.values(), *pq_claims.values()) > ALPHA:
                over.append(f"{vname} / {n}")
    ref = res["one_pair_reference"]
    print(
        f"One pair, any noise, {REFERENCE} studies: "
        + ", ".join(f"{n} {x:.4f}" for n, x in ref.items())
    )
    print(
        "Every single question of the own-variance rules at or under alpha: "
        + ("yes" if not over else "NO: " + ", ".join(over))
    )
    res["own_rules_over_alpha"] = over


# ---------------------------------------------------------------- b. time to verdict


@dataclass(frozen=True)
class Scenario:
    name: str
    medians: PerCell
    cvs: PerCell
    durations: dict[Cell, float]  # s per point
    launch_s: float
    questions: list[Question]
    truth: dict[str, str]  # question -> the verdict it should get


DESIGNS: list[tuple[str, int, int]] = [
    ("sequential 2-6", 2, 6),
    ("sequential 3-6", 3, 6),
    ("fixed 3", 3, 3),
    ("fixed 6", 6, 6),
]
SEQUENTIAL = [d for d, lo, hi in DESIGNS if lo != hi]


def study_time(sc: Scenario, rounds: int, lo: int, hi: int, launch_s: float) -> float:
    """Every point's duration per round, plus launches: one per config for a fixed design; for
    the sequential one, one per config for the first `lo` rounds and one per further round."""
    configs = len({c for c, _ in sc.durations})
    per_round = sum(sc.durations.values())
    launches = 1 if lo == hi else 1 + (rounds - lo)
    return rounds * per_round + launches * configs * launch_s


def run_scenario(sc: Scenario, studies: int, rng: np.random.Generator) -> dict[str, Any]:
    """Each design judged by the product's looks (stopping.run_looks; a fixed design: one look
    at the full alpha, `StoppingRule(n, n)`)."""
    arrays = simulate(rng, studies, max(hi for _, _, hi in DESIGNS), sc.medians, sc.cvs)
    sims = [study_tables(arrays, s) for s in range(studies)]
    out: dict[str, Any] = {}
    for dname, lo, hi in DESIGNS:
        rule = StoppingRule(lo, hi, ALPHA)
        counts = {q.name: {"right": 0, "wrong": 0, "open": 0} for q in sc.questions}
        times, free, rounds_used, all_decided = [], [], [], 0
        for tables in sims:
            lk = study_looks(sc.questions, tables, rule, hi)
            # measuring stops at the first look that leaves nothing open, as the sweep does
            used = next((lo + i for i, row in enumerate(lk) if not open_claims(row)), hi)
            final = lk[used - lo]
            all_decided += not open_claims(final)
            for e in final:
                verdict, _ = decision(e)
                key = (
                    "open"
                    if verdict == OPEN
                    else ("right" if verdict == sc.truth[e["claim"]] else "wrong")
                )
                counts[e["claim"]][key] += 1
            rounds_used.append(used)
            times.append(study_time(sc, used, lo, hi, sc.launch_s))
            free.append(study_time(sc, used, lo, hi, 0.0))
        out[dname] = {
            "mean_time_s": float(np.mean(times)),
            "mean_time_no_launch_s": float(np.mean(free)),
            "mean_rounds": float(np.mean(rounds_used)),
            "all_decided": all_decided / studies,
            "questions": {q: {k: v / studies for k, v in c.items()} for q, c in counts.items()},
        }
    out["ratios"] = {
        f"{seq} / {fixed}": {
            "launch": out[seq]["mean_time_s"] / out[fixed]["mean_time_s"],
            "no_launch": out[seq]["mean_time_no_launch_s"] / out[fixed]["mean_time_no_launch_s"],
        }
        for seq in SEQUENTIAL
        for fixed in ("fixed 3", "fixed 6")
    }
    return out


def grid(configs: Mapping[str, Sequence[int]]) -> list[Cell]:
    return [(c, lv) for c, levels in configs.items() for lv in levels]


def scenarios() -> list[Scenario]:
    out = []
    # A100 seed (001): one config, C64/C128/C256, CV 0.4%; prompts 512/1024/2048 of 128 output
    # tokens, so a point lasts prompts x 128 / throughput; launch 120 s (not in the seed).
    tput = {64: 4255.64, 128: 4996.44, 256: 4773.80}
    prompts = {64: 512, 128: 1024, 256: 2048}
    cells = [("vllm", c) for c in tput]
    out.append(
        Scenario(
            "A100 seed (C128 > C256, 4.7%, CV 0.4%)",
            {"output_throughput": {("vllm", c): v for c, v in tput.items()}},
            {"output_throughput": {c: 0.004 for c in cells}},
            {("vllm", c): prompts[c] * 128 / tput[c] for c in tput},
            120.0,
            [
                Question(
                    "throughput C128 > C256", "output_throughput", ("vllm", 128), ("vllm", 256), ">"
                )
            ],
            {"throughput C128 > C256": "holds"},
        )
    )
    # V100 seed (000): max-num-seqs 1 flat at 45.5 tok/s, max-num-seqs 12 at 45.5/75.5 (1.66x)/
    # 60 (the valley; assumed)/156.1 at c=1/2/4/8. TTFT (assumed, ms): serialized (c-1) x 2.8 s
    # plus 0.5 s; batched 0.5-1.5 s. CV 2% everywhere (assumed); 4 x c requests of 256 output
    # tokens per point; launch 120 s (assumed).
    levels = (1, 2, 4, 8)
    v_tput = {("mns-1", c): 45.5 for c in levels} | {
        ("mns-12", 1): 45.5,
        ("mns-12", 2): 75.5,
        ("mns-12", 4): 60.0,
        ("mns-12", 8): 156.1,
    }
    v_ttft = {("mns-1", c): 500.0 + (c - 1) * 2800.0 for c in levels} | {
        ("mns-12", 1): 500.0,
        ("mns-12", 2): 800.0,
        ("mns-12", 4): 1000.0,
        ("mns-12", 8): 1500.0,
    }
    vcells = grid({"mns-1": levels, "mns-12": levels})
    q1 = Question(
        "throughput[12,c=8] > 1.5 * throughput[1,c=8]",
        "output_throughput",
        ("mns-12", 8),
        ("mns-1", 8),
        ">",
        1.5,
    )
    q2 = Question(
        "mean_ttft_ms[1,c=8] > 2 * mean_ttft_ms[1,c=1]",
        "mean_ttft_ms",
        ("mns-1", 8),
        ("mns-1", 1),
        ">",
        2.0,
    )
    out.append(
        Scenario(
            "V100 seed (3.4x throughput, TTFT grows; CV 2%)",
            {"output_throughput": v_tput, "mean_ttft_ms": v_ttft},
            {m: {c: 0.02 for c in vcells} for m in METRICS},
            {c: 4 * c[1] * 256 / v_tput[c] for c in vcells},
            120.0,
            [q1, q2],
            {q1.name: "holds", q2.name: "holds"},
        )
    )
    # the default experiment: v6's means and CVs per cell, its three comparison claims (the
    # analysis's threshold for the one without a factor), v6's mean point durations, launch 36 s.
    means, cvs = latest_means()
    claims = config_claims(threshold_pct=None)
    out.append(
        Scenario(
            "default experiment (v6 means, CVs, durations)",
            means,
            cvs,
            latest_durations(),
            36.0,
            claims,
            {q.name: "holds" for q in claims},
        )
    )
    # a close call: the default experiment's shape and durations, CV 2% everywhere, and a 3%
    # difference (1.5x the CV) between the two configs at c=16; no threshold.
    dcells = sorted(latest_durations())
    close = {c: 100.0 * (1.03 if c == ("max-num-seqs-8", 16) else 1.0) for c in dcells}
    q = Question(
        "throughput[8,c=16] > throughput[1,c=16] (3%)",
        "output_throughput",
        ("max-num-seqs-8", 16),
        ("max-num-seqs-1", 16),
        ">",
    )
    out.append(
        Scenario(
            "close call (3% effect, CV 2%, default shape)",
            {"output_throughput": close},
            {"output_throughput": {c: 0.02 for c in dcells}},
            latest_durations(),
            36.0,
            [q],
            {q.name: "holds"},
        )
    )
    return out


def part_b(studies: int, seed: int) -> dict[str, Any]:
    print(f"\nb. time to verdict: {studies} studies per scenario", flush=True)
    res: dict[str, Any] = {}
    for i, sc in enumerate(scenarios()):
        t0 = time.perf_counter()
        res[sc.name] = run_scenario(sc, studies, np.random.default_rng([seed, 2, i]))
        res[sc.name]["per_round_s"] = sum(sc.durations.values())
        res[sc.name]["launch_s"] = sc.launch_s
        print(f"  {sc.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return res


def print_b(res: dict[str, Any]) -> None:
    for name, r in res.items():
        print(
            f"\n{name}: one round {r['per_round_s']:.1f} s of points, launch {r['launch_s']:.0f} s"
        )
        print(
            f"  {'design':<16} {'mean time s':>12} {'no launch s':>12} {'mean rounds':>12} "
            f"{'all decided':>12}   per question: right / wrong / open"
        )
        for dname, _, _ in DESIGNS:
            d = r[dname]
            qs = "; ".join(
                f"{q}: {c['right']:.3f} / {c['wrong']:.3f} / {c['open']:.3f}"
                for q, c in d["questions"].items()
            )
            print(
                f"  {dname:<16} {d['mean_time_s']:>12.1f} {d['mean_time_no_launch_s']:>12.1f} "
                f"{d['mean_rounds']:>12.2f} {d['all_decided']:>12.3f}   {qs}"
            )
        for pair, x in r["ratios"].items():
            print(f"  time ratio {pair} = {x['launch']:.3f} (no launch cost: {x['no_launch']:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--studies", type=int, default=10000, help="simulated studies per case (default 10000)"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    ap.add_argument(
        "--part",
        choices=("a", "b", "both"),
        default="both",
        help="which part to run (default both)",
    )
    ap.add_argument("--json", type=Path, help="also write every number to this JSON file")
    args = ap.parse_args()
    if args.studies < CHECKED:
        ap.error(f"--studies {args.studies}: give at least {CHECKED}")
    t0 = time.perf_counter()
    out: dict[str, Any] = {"studies": args.studies, "seed": args.seed, "alpha": ALPHA}
    if args.part in ("a", "both"):
        out["error_rate"] = part_a(args.studies, args.seed)
        print_a(out["error_rate"], args.studies)
    if args.part in ("b", "both"):
        out["time_to_verdict"] = part_b(args.studies, args.seed)
        print_b(out["time_to_verdict"])
    took = time.perf_counter() - t0
    print(f"\ntook {took:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
