"""Claims (claims.json): statements a write-up makes, checked against the raw data - a paired
comparison of one metric at two points, or a knee, dominance, past-knee or serialized verdict.
The syntax (claims_syntax) is checked when the config is validated."""

from __future__ import annotations

from typing import Any

from servelab.analysis.dataset import Point
from servelab.analysis.groups import SUMMARY_METRICS, Groups, hit_order, invalid_text
from servelab.analysis.knee import DOMINANCE
from servelab.analysis.stats import describe, paired
from servelab.analysis.validity import Flag
from servelab.claims_syntax import CMP as _CMP
from servelab.claims_syntax import FUNC as _FUNC
from servelab.claims_syntax import parse_claim
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection

ALIASES = {"throughput": "output_throughput", "tput": "output_throughput"}
# what each kind of claim reads, besides the metric a comparison names
CLAIM_READS = {
    "dominated": [m for m, _ in DOMINANCE],
    "past_knee": ["output_throughput", "p99_ttft_ms"],
    "knee": ["output_throughput", "p99_ttft_ms"],
    "serialized": ["output_throughput", "duration", "num_prompts"],
}


def _claim_left_out(
    g: Groups, keys: list[tuple[str, int]], metrics: list[str]
) -> list[tuple[Point, Flag]]:
    found: dict[tuple[str, int, int, str], tuple[Point, Flag]] = {}
    for sc, c in keys:
        for m in metrics:
            for p, f in g.left_out(sc, c, m):
                found.setdefault((sc, c, p.repeat, f.check), (p, f))
    return sorted(found.values(), key=hit_order)


def _invalid_claim(claim: str, hits: list[tuple[Point, Flag]]) -> dict[str, Any]:
    return {
        "claim": claim,
        "verdict": "invalid",
        "reason": invalid_text(hits),
        "evidence": {
            "invalid": [
                {
                    "server_config": p.server_config,
                    "repeat": p.repeat,
                    "concurrency": p.concurrency,
                    "check": f.check,
                    "reason": f.reason,
                }
                for p, f in sorted(hits, key=hit_order)
            ]
        },
    }


def _selector(text: str, claim: str, g: Groups, need_c: bool = True) -> tuple[str, int | None]:
    parts = dict(p.split("=", 1) for p in (x.strip() for x in text.split(",")) if "=" in p)
    keys = set(parts) - {"c", "config"}
    bad = [x.strip() for x in text.split(",") if x.strip() and "=" not in x]
    if keys or bad:
        raise ServelabError(f"analysis.claims: {claim!r}: selectors are c=N and config=NAME")
    sc = parts.get("config", "").strip()
    if not sc:
        if len(g.configs) != 1:
            raise ServelabError(
                f"analysis.claims: {claim!r}: name the config=..., there are several"
            )
        sc = g.configs[0]
    if sc not in g.configs:
        raise ServelabError(f"analysis.claims: {claim!r}: config {sc!r} was not measured")
    c = parts.get("c")
    if c is None:
        if need_c:
            raise ServelabError(f"analysis.claims: {claim!r}: give the concurrency, e.g. [c=8]")
        return sc, None
    if not c.strip().isdigit() or int(c) not in g.levels(sc):
        raise ServelabError(
            f"analysis.claims: {claim!r}: concurrency {c} was not measured for {sc}"
        )
    return sc, int(c)


def evaluate_claims(
    g: Groups,
    analysis: AnalysisSection,
    knees: list[dict[str, Any]],
    dominated: list[dict[str, Any]],
    diags: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for claim in analysis.claims:
        try:
            parse_claim(claim)
        except ServelabError as exc:
            raise ServelabError(f"analysis.claims: {exc}") from None
        m = _CMP.match(claim)
        if m:
            ma, sel_a, op, factor, mb, sel_b = m.groups()
            metric_a = ALIASES.get(ma, ma)
            metric_b = ALIASES.get(mb, mb)
            if metric_a != metric_b or metric_a not in SUMMARY_METRICS:
                raise ServelabError(
                    f"analysis.claims: {claim!r}: compare one metric of "
                    f"{', '.join(SUMMARY_METRICS)}"
                )
            sa, ca = _selector(sel_a, claim, g)
            sb, cb = _selector(sel_b, claim, g)
            lost = _claim_left_out(g, [(sa, ca), (sb, cb)], [metric_a])  # type: ignore[list-item]
            if lost:
                out.append(_invalid_claim(claim, lost))
                continue
            va, vb = g.pair(sa, ca, sb, cb, metric_a)  # type: ignore[arg-type]
            k = float(factor) if factor else 1.0
            test = paired(
                va, [k * x for x in vb], 0.0 if factor else analysis.threshold_pct, analysis.alpha
            )
            want = "a > b" if op == ">" else "a < b"
            if test.verdict == want:
                verdict = "holds"
            elif test.verdict in ("a > b", "a < b"):
                verdict = "fails"
            else:
                verdict = "inconclusive"
            out.append(
                {
                    "claim": claim,
                    "verdict": verdict,
                    "evidence": {
                        "a": {"config": sa, "concurrency": ca, "mean": describe(va).mean},
                        "b": {
                            "config": sb,
                            "concurrency": cb,
                            "mean": describe(vb).mean,
                            "factor": k,
                        },
                        "n": test.n,
                        "mean_rel_diff_pct": test.mean_rel_diff_pct,
                        "agree": test.agree,
                        "p_value": test.p_value,
                        "test_verdict": test.verdict,
                    },
                }
            )
            continue
        f = _FUNC.match(claim)
        assert f is not None
        func, args, expect = f.groups()
        sc, c = _selector(args, claim, g, need_c=func in ("dominated", "past_knee"))
        # these read the means of every level of the config
        lost = _claim_left_out(g, [(sc, lv) for lv in g.levels(sc)], CLAIM_READS[func])
        if lost:
            out.append(_invalid_claim(claim, lost))
            continue
        if func in ("dominated", "past_knee"):
            if func == "dominated":
                hits = [d for d in dominated if d["server_config"] == sc and d["concurrency"] == c]
            else:
                hits = [
                    d
                    for d in diags
                    if d["kind"] == "past_knee"
                    and d["server_config"] == sc
                    and c in d["concurrency"]
                ]
            out.append({"claim": claim, "verdict": "holds" if hits else "fails", "evidence": hits})
        elif func == "serialized":
            hits = [d for d in diags if d["kind"] == "serialized" and d["server_config"] == sc]
            out.append({"claim": claim, "verdict": "holds" if hits else "fails", "evidence": hits})
        else:
            kn = next(x for x in knees if x["server_config"] == sc)
            ok = kn["concurrency"] is not None and (
                expect is None or kn["concurrency"] == int(expect)
            )
            out.append({"claim": claim, "verdict": "holds" if ok else "fails", "evidence": kn})
    return out
