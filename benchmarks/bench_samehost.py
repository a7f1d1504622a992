"""Runtimes compared in three words: the family's error rate, simulated.

"Runtimes compared" (servelab.analysis.runtimes) answers every level x metric of B against A
with servelab.analysis.samehost's words: SAME, DIFFERENT (faster or slower) or UNKNOWN at the
equivalence margin (`analysis.margin_pct`, 10%), each row at alpha / (decisions x looks)
(`equivalence.family_alpha`), its interval at 1 - 2 x that (two one-sided tests). This
simulates the version A/B example's plan (config/experiments/vllm-version-ab-cpu.yaml: 3 levels
x 3 metrics, interleaved rounds 3 to 5; other plans by option) round by round: after each
round from 3 on, the words on the rounds so far; measuring stops at the first look with no row
UNKNOWN, or after round 5, and the answer is that look's words.

Each row's round-to-round log speed ratio B / A is normal with SD `spread` around the true
effect, the rows independent (metrics of one point move together in a real run, which only
lowers the family's error rate: Bonferroni holds under any dependence). Two truths:

  identical   the same runtime twice: a wrong answer is any DIFFERENT
  20% slower  B's speed 1 / 1.2 of A's on every row: a wrong answer is any SAME (and any
              DIFFERENT (faster))

For each: the chance of a wrong answer anywhere in the family, in the final answer and at any
look; the share of rows decided (SAME or DIFFERENT); the rounds spent. Beside them, the rule the
section had before: the paired t-test of every row at alpha, unadjusted, on the rounds of the
final look: where nothing differs, the chance that any row is called faster or slower; where B
is 20% slower, the share of rows it calls slower.

The words are computed for every study at once with numpy, with equivalence.decide's formulas;
the first 50 studies of each case are checked against equivalence.decide itself (the script
stops if one differs).

    python benchmarks/bench_samehost.py [--studies 20000] [--seed 0] [--levels 3] [--metrics 3]
        [--rounds 3:5] [--margin 10] [--spreads 3,5,8]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from servelab.analysis.equivalence import DIFFERENT, SAME, UNKNOWN, decide, family_alpha

ALPHA = 0.05
CHECKED = 50  # studies per case checked against equivalence.decide


@dataclass(frozen=True)
class Plan:
    """The comparison simulated: levels x metrics rows, rounds min to max (a look after each
    from min on), the equivalence margin. The default is the version A/B example's;
    `servelab rerun`'s is rounds 3 to 6."""

    levels: int = 3
    metrics: int = 3
    min_rounds: int = 3
    max_rounds: int = 5
    margin_pct: float = 10.0

    @property
    def rows(self) -> int:
        return self.levels * self.metrics

    @property
    def looks(self) -> int:
        return self.max_rounds - self.min_rounds + 1


@dataclass(frozen=True)
class Result:
    studies: int
    wrong_final: float  # share of studies with a wrong word in the final answer
    wrong_any_look: float  # ... at any look
    decided: float  # share of rows SAME or DIFFERENT in the final answer
    rounds: float  # mean rounds measured
    # the unadjusted paired tests: identical, the share of studies with a row called faster or
    # slower; 20% slower, the share of rows called slower
    paired: float


def words(logs: np.ndarray, alpha: float, margin_pct: float) -> np.ndarray:
    """Per study and row, the word of the speed ratio's interval on the rounds of `logs`
    (studies x rows x rounds of log speed ratios): 0 UNKNOWN, 1 SAME, 2 DIFFERENT (faster),
    3 DIFFERENT (slower)."""
    n = logs.shape[-1]
    mean = logs.mean(axis=-1)
    sd = logs.std(axis=-1, ddof=1)
    half = float(sps.t.ppf(1.0 - alpha, n - 1)) * sd / math.sqrt(n)  # 1 - 2 alpha, two-sided
    low, high = np.exp(mean - half), np.exp(mean + half)
    top = 1.0 + margin_pct / 100.0
    out = np.zeros(mean.shape, dtype=np.int8)
    out[(low >= 1.0 / top) & (high <= top)] = 1
    out[low > top] = 2
    out[high < 1.0 / top] = 3
    return out


def paired_calls(logs: np.ndarray, alpha: float) -> np.ndarray:
    """Per study and row, whether the paired t-test on the log ratios calls a difference."""
    n = logs.shape[-1]
    mean = logs.mean(axis=-1)
    se = logs.std(axis=-1, ddof=1) / math.sqrt(n)
    p = 2.0 * sps.t.sf(np.abs(mean / se), n - 1)
    return np.asarray(p < alpha)


def check_against_decide(logs: np.ndarray, got: np.ndarray, alpha: float, plan: Plan) -> None:
    """The vectorized words of the first studies are equivalence.decide's."""
    code = {(SAME, None): 1, (DIFFERENT, "faster"): 2, (DIFFERENT, "slower"): 3}
    for s in range(min(CHECKED, logs.shape[0])):
        for r in range(plan.rows):
            b = list(np.exp(logs[s, r]))
            d = decide(b, [1.0] * len(b), True, plan.margin_pct, alpha)
            want = 0 if d.word == UNKNOWN else code[d.word, d.direction]
            if want != got[s, r]:
                raise SystemExit(f"study {s} row {r}: decide says {d.label}, the bench {got[s, r]}")


def simulate(
    rng: np.random.Generator,
    studies: int,
    spread: float,
    effect: float,
    plan: Plan = Plan(),
) -> Result:
    """`effect`: the true log speed ratio B / A of every row (0: identical runtimes)."""
    ROWS, MIN_ROUNDS, MAX_ROUNDS = plan.rows, plan.min_rounds, plan.max_rounds  # noqa: N806
    each = family_alpha(ALPHA, ROWS, plan.looks)
    logs = effect + rng.normal(0.0, spread, (studies, ROWS, MAX_ROUNDS))
    wrong = (lambda w: w >= 2) if effect == 0.0 else (lambda w: (w == 1) | (w == 2))
    final = np.zeros((studies, ROWS), dtype=np.int8)
    rounds = np.full(studies, MAX_ROUNDS)
    running = np.ones(studies, dtype=bool)
    wrong_any = np.zeros(studies, dtype=bool)
    for k in range(MIN_ROUNDS, MAX_ROUNDS + 1):
        w = words(logs[..., :k], each, plan.margin_pct)
        check_against_decide(logs[..., :k], w, each, plan)
        wrong_any |= running & wrong(w).any(axis=1)
        stop = running & ((w != 0).all(axis=1) | (k == MAX_ROUNDS))
        final[stop] = w[stop]
        rounds[stop & running] = k
        running &= ~stop
    calls = np.zeros((studies, ROWS), dtype=bool)
    for k in range(MIN_ROUNDS, MAX_ROUNDS + 1):
        at = rounds == k
        calls[at] = paired_calls(logs[at][..., :k], ALPHA)
    if effect == 0.0:  # any row called faster or slower where nothing differs
        paired = float(calls.any(axis=1).mean())
    else:  # the share of rows called slower, as a 20% slowdown is
        slower = logs[..., :MAX_ROUNDS].mean(axis=-1) < 0
        paired = float((calls & slower).mean())
    return Result(
        studies,
        float(wrong(final).any(axis=1).mean()),
        float(wrong_any.mean()),
        float((final != 0).mean()),
        float(rounds.mean()),
        paired,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--levels", type=int, default=3)
    ap.add_argument("--metrics", type=int, default=3)
    ap.add_argument("--rounds", default="3:5", help="MIN:MAX (servelab rerun's: 3:6)")
    ap.add_argument("--margin", type=float, default=10.0, help="analysis.margin_pct")
    ap.add_argument("--spreads", default="3,5,8", help="round-to-round spreads, percent")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.rounds.split(":"))
    plan = Plan(args.levels, args.metrics, lo, hi, args.margin)
    each = family_alpha(ALPHA, plan.rows, plan.looks)
    print(
        f"{plan.levels} levels x {plan.metrics} metrics, rounds {lo}-{hi} ({plan.looks} looks), "
        f"margin {plan.margin_pct:g}%, family alpha {ALPHA}: each interval at "
        f"{1 - 2 * each:.5f}; {args.studies} studies per case"
    )
    print(
        f"{'truth':>11} {'spread':>6} {'wrong: final':>12} {'any look':>8} {'decided':>8} "
        f"{'rounds':>6} {'paired at alpha':>15}"
    )
    for name, effect in (("identical", 0.0), ("20% slower", -math.log(1.2))):
        for i, spread in enumerate(float(x) / 100 for x in args.spreads.split(",")):
            rng = np.random.default_rng([args.seed, i, int(effect != 0.0)])
            r = simulate(rng, args.studies, spread, effect, plan)
            print(
                f"{name:>11} {100 * spread:5.0f}% {r.wrong_final:12.4f} {r.wrong_any_look:8.4f} "
                f"{r.decided:8.3f} {r.rounds:6.2f} {r.paired:15.4f}"
            )


if __name__ == "__main__":
    main()
