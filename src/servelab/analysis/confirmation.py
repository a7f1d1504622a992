"""A confirmation experiment's verdicts (analysis/confirmation.json, the report's
"Confirmation" section): per proposal of analysis.confirms, confirmed (every claim of it
holds), refuted (one fails: the paired test found the proposed configuration below what the
proposal promised) or inconclusive (otherwise: not significant, invalid points), and what the
change bought at each judged concurrency: tok/s and TTFT before and after, the throughput
ratio with its 95% confidence interval over the paired repeats, and energy per output token
where telemetry measured it (GPUs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypedDict

from servelab.analysis.groups import Groups
from servelab.analysis.proposals import change_words
from servelab.analysis.stats import describe
from servelab.documents.declared import (
    ConfirmationRecord,
    Effect,
    EffectAfter,
    EffectBefore,
    JudgedClaim,
    ProposalVerdict,
)
from servelab.experiment import ConfirmsProposal, ConfirmsSection
from servelab.render import md_table, num

if TYPE_CHECKING:
    from servelab.documents.declared import ClaimVerdict

# what a proposal's effect reports, before and after (energy only where it was measured)
EffectMetric = Literal[
    "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "joules_per_output_token"
]
EFFECT_METRICS: tuple[EffectMetric, ...] = (
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "joules_per_output_token",
)


class Ratio(TypedDict):
    """after / before output throughput over the paired repeats (`_ratio`)."""

    n: int
    throughput_ratio: float | None
    ratio_ci95: list[float] | None


def proposal_verdict(verdicts: list[str]) -> str:
    """confirmed when every claim holds, refuted when one fails, else inconclusive."""
    if verdicts and all(v == "holds" for v in verdicts):
        return "confirmed"
    if "fails" in verdicts:
        return "refuted"
    return "inconclusive"


def _ratio(g: Groups, before: str, after: str, c: int) -> Ratio:
    """after / before output throughput over the paired repeats: the geometric mean of the
    per-repeat ratios and its 95% confidence interval (t on the log ratios)."""
    va, vb = g.pair(after, c, before, c, "output_throughput")
    logs = [math.log(a / b) for a, b in zip(va, vb, strict=True) if a > 0 and b > 0]
    d = describe(logs)
    if d.mean is None:
        return {"n": 0, "throughput_ratio": None, "ratio_ci95": None}
    ci = None
    if d.ci95_low is not None and d.ci95_high is not None:
        ci = [math.exp(d.ci95_low), math.exp(d.ci95_high)]
    return {"n": d.n, "throughput_ratio": math.exp(d.mean), "ratio_ci95": ci}


def _effect(g: Groups, p: ConfirmsProposal, c: int) -> Effect:
    before: EffectBefore = {}
    after: EffectAfter = {}
    for m in EFFECT_METRICS:
        b, a = g.mean(p.server_config, c, m), g.mean(p.config, c, m)
        if b is None or a is None:
            continue
        before[m] = b
        after[m] = a
    return {
        "concurrency": c,
        "before": before,
        "after": after,
        **_ratio(g, p.server_config, p.config, c),
    }


def confirmation(
    g: Groups, claims: Sequence[ClaimVerdict], confirms: ConfirmsSection
) -> ConfirmationRecord:
    """confirmation.json: the diagnosing experiment and each proposal's verdict, claims and
    effects, then the proposals that were not tried."""
    verdict_of = {c["claim"]: c["verdict"] for c in claims}
    proposals: list[ProposalVerdict] = []
    for p in confirms.proposals:
        judged: list[JudgedClaim] = [
            {"claim": c, "verdict": verdict_of.get(c, "inconclusive")} for c in p.claims
        ]
        proposals.append(
            {
                "id": p.id,
                "diagnoses": list(p.diagnoses),
                "server_config": p.server_config,
                "config": p.config,
                "change": dict(p.change),
                "expected": p.expected,
                "verdict": proposal_verdict([j["verdict"] for j in judged]),
                "claims": judged,
                "effects": [_effect(g, p, c) for c in p.concurrency],
            }
        )
    return {
        "experiment": confirms.experiment,
        "bundle": confirms.bundle,
        "manifest_sha256": confirms.manifest_sha256,
        "proposals": proposals,
        "not_tried": [n.to_json() for n in confirms.not_tried],
    }


def verdict_line(p: ProposalVerdict) -> str:
    """One proposal's verdict in one line: what changed, the verdict, the throughput ratio
    at each judged concurrency."""
    change = change_words(p["change"])
    ratios = []
    for e in p["effects"]:
        r, ci = e["throughput_ratio"], e["ratio_ci95"]
        if r is None:
            continue
        text = f"c={e['concurrency']} {r:.2f}x"
        if ci is not None:
            text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
        ratios.append(text)
    what = f"; throughput after/before {', '.join(ratios)}" if ratios else ""
    return f"{p['id']} {p['verdict']}: {change} on {p['server_config']}{what}"


def _pair(e: Effect, m: EffectMetric, fmt: str) -> str:
    if m not in e["before"]:
        return "-"
    return f"{num(e['before'][m], fmt)} → {num(e['after'][m], fmt)}"


def confirmation_section(conf: ConfirmationRecord) -> list[str]:
    """The report's "Confirmation" section."""
    lines = [
        "",
        "## Confirmation",
        "",
        f"This experiment measures the proposals of `{conf['experiment']}` (its bundle "
        f"`{conf['bundle']}`, manifest sha256 `{conf['manifest_sha256'][:16]}…`): each "
        "diagnosed configuration beside the proposed one, in one balanced design. A proposal "
        "is confirmed when every claim of it holds, refuted when one fails, inconclusive "
        "otherwise. Ratios: after / before output throughput, geometric mean over the paired "
        "repeats with its 95% confidence interval.",
        "",
    ]
    for p in conf["proposals"]:
        change = " ".join(f"`--{k} {v}`" for k, v in p["change"].items())
        lines.append(
            f"- **{p['id']} {p['verdict']}**: {change} on {p['server_config']} (from "
            f"{', '.join(p['diagnoses'])}); expected: {p['expected']}."
        )
    lines.append("")
    rows = []
    for p in conf["proposals"]:
        for e in p["effects"]:
            ci = e["ratio_ci95"]
            ratio = "-" if e["throughput_ratio"] is None else f"{e['throughput_ratio']:.2f}x"
            if ci is not None:
                ratio += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
            rows.append(
                [
                    p["id"],
                    str(e["concurrency"]),
                    _pair(e, "output_throughput", ".1f"),
                    ratio,
                    _pair(e, "mean_ttft_ms", ".1f"),
                    _pair(e, "p99_ttft_ms", ".1f"),
                    _pair(e, "joules_per_output_token", ".3f"),
                ]
            )
    lines += md_table(
        [
            "Proposal",
            "Concurrency",
            "Output tok/s before → after",
            "Ratio [95% CI]",
            "Mean TTFT ms",
            "p99 TTFT ms",
            "J per output token",
        ],
        rows,
    )
    if conf["not_tried"]:
        lines += ["", "Not tried:", ""]
        lines += [
            f"- {n['proposal']} on {n['server_config']} (from {', '.join(n['diagnoses'])}): "
            f"{n['reason']}."
            for n in conf["not_tried"]
        ]
    return lines
