"""The stopping rule of a sequential sweep (`sweep.repeats: {min, max}`): after each round, is
every question decided?

A round is one balanced repeat of every point. After round k (from `min` on) each paired
comparison is tested on the log ratios of its two points, a_r / b_r over rounds r <= k, by a
paired t-test on those ratios alone (k - 1 degrees of freedom): the pair's own spread, so the
test holds its error rate however noisy its two points are next to the others. (A spread
pooled over every point gives far more degrees of freedom early, but the points of a real run
are not equally noisy: simulated with the per-point noise of six real runs, the noisiest pair's
wrong verdicts reached 9% at alpha 5%; benchmarks/README.md.)

The look's alpha is `alpha / (max - min + 1)`: the error rate is spent in equal parts over the
looks the plan allows, so that the chance of a wrong verdict on a question over all its looks
stays under `alpha` however many are taken (Bonferroni: it holds for any dependence between the
looks).

A question is decided at the first look where the test calls the difference real (and it
reaches the analysis's `threshold_pct` where the claim names no factor); its verdict stays.
`run_looks` is that loop over the looks, the one the sweep, the analysis (analysis.rounds) and
the simulation of the rule (benchmarks/bench_sequential.py) run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict, TypeVar

import numpy as np
from scipy import stats as sps

from servelab.documents.declared import RuleJson, SequentialTestJson
from servelab.errors import ServelabError

METHOD = "group-sequential paired t-test on log ratios, Bonferroni alpha spending"
OPEN = "open"


class LookEvidence(SequentialTestJson):
    """A comparison's `evidence.sequential`: the test at the look after round `round`."""

    round: int


@dataclass(frozen=True)
class StoppingRule:
    """The plan (`min` and `max` rounds, an optional time budget) and the error rate."""

    min_rounds: int
    max_rounds: int
    alpha: float
    budget_s: float | None = None

    @property
    def looks(self) -> int:
        return self.max_rounds - self.min_rounds + 1

    def look_alpha(self, k: int) -> float:
        """The alpha of the look after round k: 0 before `min` (no look), alpha / looks
        from `min` to `max`."""
        return self.alpha / self.looks if self.min_rounds <= k <= self.max_rounds else 0.0

    def to_json(self) -> RuleJson:
        return {
            "method": METHOD,
            "min_rounds": self.min_rounds,
            "max_rounds": self.max_rounds,
            "budget_s": self.budget_s,
            "alpha": self.alpha,
            "look_alpha": float(f"{self.alpha / self.looks:.6g}"),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> StoppingRule:
        """The rule a run.json records; one this servelab does not implement is an error (its
        verdicts would not be the ones the sweep stopped on)."""
        if d.get("method") != METHOD:
            raise ServelabError(
                f"the sweep was stopped by {d.get('method')!r}; this servelab implements "
                f"{METHOD!r}: analyse it with the servelab that measured it"
            )
        budget_s = d.get("budget_s")
        return cls(
            int(_number(d["min_rounds"])),
            int(_number(d["max_rounds"])),
            float(_number(d["alpha"])),
            None if budget_s is None else float(_number(budget_s)),
        )


def _number(value: object) -> float:
    """A number of a recorded rule (TypeError where it is not one)."""
    if not isinstance(value, int | float):
        raise TypeError(f"a stopping rule's {value!r} is not a number")
    return value


@dataclass(frozen=True)
class SequentialTest:
    n: int
    mean_log_ratio: float | None
    se: float | None
    df: int | None
    t: float | None
    p_value: float | None
    look_alpha: float
    verdict: str  # "a > b" | "a < b" | OPEN

    def to_json(self) -> SequentialTestJson:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        return {
            "n": self.n,
            "mean_log_ratio": r(self.mean_log_ratio),
            "se": r(self.se),
            "df": self.df,
            "t": r(self.t),
            "p_value": None if self.p_value is None else float(f"{self.p_value:.4g}"),
            "look_alpha": float(f"{self.look_alpha:.4g}"),
            "test_verdict": self.verdict,
        }


def sequential_test(
    a: Sequence[float],
    b: Sequence[float],
    look_alpha: float,
    threshold_pct: float = 0.0,
) -> SequentialTest:
    """Test a against b (paired by round) at one look. `b` already carries a claim's factor."""
    n = len(a)
    if n < 2 or n != len(b) or any(x <= 0 for x in (*a, *b)):
        return SequentialTest(n, None, None, None, None, None, look_alpha, OPEN)
    d = np.log(np.asarray(a, dtype=np.float64)) - np.log(np.asarray(b, dtype=np.float64))
    mean = float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0.0:
        # the same ratio in every round: no noise, the sign alone decides
        p = 0.0 if mean != 0.0 else 1.0
        t = math.copysign(math.inf, mean) if mean else 0.0
    else:
        t = mean / se
        p = float(2.0 * sps.t.sf(abs(t), n - 1))
    rel_pct = 100.0 * math.expm1(mean)
    real = look_alpha > 0 and p < look_alpha and abs(rel_pct) >= threshold_pct
    verdict = ("a > b" if mean > 0 else "a < b") if real else OPEN
    return SequentialTest(n, mean, se, n - 1, t, p, look_alpha, verdict)


class LookTested(TypedDict):
    """A comparison's `evidence` at a look: its test (`look_evidence`)."""

    sequential: LookEvidence


class Entry(TypedDict):
    """A comparison's entry at a look, as claims.json has it (analysis.claims.ClaimVerdict,
    with more evidence): the claim, its verdict and the test of the look."""

    claim: str
    verdict: str
    evidence: LookTested


# the entries run_looks keeps: a claim's entry as claims.json has it (analysis.claims.
# ClaimVerdict: `claim`, `verdict`, `evidence`; a comparison tested at a look carries the test
# in `evidence.sequential`, with the round of the look), or any of that shape (Entry)
AnEntry = TypeVar("AnEntry", bound=Mapping[str, object])


def claim_verdict(op: str, test_verdict: str) -> str:
    """A comparison claim's verdict from its test: holds where the test found the sign the
    claim's `op` (">" or "<") says, fails where it found the other, else inconclusive."""
    if test_verdict not in ("a > b", "a < b"):
        return "inconclusive"
    return "holds" if test_verdict == ("a > b" if op == ">" else "a < b") else "fails"


def look_evidence(k: int, test: SequentialTest) -> LookEvidence:
    """A comparison's `evidence.sequential` at the look after round k."""
    return {"round": k, **test.to_json()}


def is_open(entry: Mapping[str, object]) -> bool:
    """A comparison the look's test left undecided (a claim judged otherwise is never open)."""
    ev = entry.get("evidence")
    return entry["verdict"] == "inconclusive" and isinstance(ev, Mapping) and "sequential" in ev


def is_decided(entry: Mapping[str, object]) -> bool:
    """A comparison the look's test decided: it keeps this entry at every later look."""
    ev = entry.get("evidence")
    return isinstance(ev, Mapping) and "sequential" in ev and not is_open(entry)


def run_looks(
    rule: StoppingRule, rounds: int, look: Callable[[int], Sequence[AnEntry]]
) -> list[list[AnEntry]]:
    """Every look from `rule.min_rounds` to `rounds` (at most `rule.max_rounds`): `look(k)`,
    the questions' entries on rounds 1..k, except that a comparison decided at an earlier look
    keeps the entry (verdict and evidence) of the look that decided it."""
    kept: dict[str, AnEntry] = {}
    out: list[list[AnEntry]] = []
    for k in range(rule.min_rounds, min(rounds, rule.max_rounds) + 1):
        row = []
        for entry in look(k):
            name = str(entry["claim"])
            if name in kept:
                entry = kept[name]
            elif is_decided(entry):
                kept[name] = entry
            row.append(entry)
        out.append(row)
    return out
