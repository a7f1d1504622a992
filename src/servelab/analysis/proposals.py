"""Proposals: the change each diagnosis with a remedy suggests, as data (diagnoses.json
`proposal`), with the claim that a confirmation experiment (`snakemake confirm`,
servelab.confirm) tests. A diagnosis without a remedy says why (`no_remedy`).

- serialized, kv_headroom_unused: `--max-num-seqs` raised to the sequences the startup log says
  the KV cache fits (floor of "Maximum concurrency ... Nx"), never above it; the claim is output
  throughput at least PROPOSED_MIN_RATIO times the diagnosed configuration's at each diagnosed
  concurrency where the change could in principle give twice that (min(c, new) / old >= 2 x
  PROPOSED_MIN_RATIO): a 1.5x bar where the ideal is 2x would judge the host's batching
  efficiency, not the fix.
- non_monotonic (a batch outside the captured CUDA graphs): a capture size list that adds every
  measured batch above the largest captured size (`--compilation-config`); the claim is output
  throughput above the diagnosed configuration's at the dip.
- past_knee, dominated: an operating point (the knee, the dominating level), not a server
  change: the diagnosing sweep measured it already, so it is reported, not run.
- utilization_misleading: a reading to distrust, no setting to change."""

from __future__ import annotations

import json
import math
from typing import cast

from servelab.analysis.dataset import Capacity
from servelab.analysis.diagnosis_records import (
    Change,
    FlatSpan,
    NoRemedy,
    PastKneeEvidence,
)
from servelab.analysis.groups import Groups
from servelab.analysis.knee import DominanceRow, dominance_levels
from servelab.documents.declared import Diagnosis, Proposal

PROPOSED_MIN_RATIO = 1.5  # the throughput factor a max-num-seqs proposal claims

NO_REMEDY_UTILIZATION = "a reading to distrust, not a server setting: judge the server by tokens/s"


def not_launched(fact: str) -> str:
    """Why a fact of the server's arguments is missing for a server servelab did not launch
    (runtime.kind endpoint; capacity.json `launched` false), in words."""
    return (
        f"{fact} is unknown: servelab did not launch this server (runtime.kind endpoint) and "
        "cannot change its arguments"
    )


def launched(cap: Capacity) -> bool:
    """Whether servelab launched the server capacity.json describes (older ones: it did)."""
    return cap.get("launched") is not False


def max_num_seqs(cap: Capacity) -> int | None:
    """--max-num-seqs as capacity.json records it (the non-default arguments first)."""
    nd = cap.get("non_default_args") or {}
    for v in (nd.get("max_num_seqs"), cap.get("max_num_seqs")):
        if isinstance(v, int | float) and not isinstance(v, bool):
            return int(v)
    return None


def change_words(change: Change) -> str:
    """A change as the vLLM arguments it sets, e.g. `--max-num-seqs 8`."""
    return " ".join(f"--{k} {v}" for k, v in change.items())


def proposed_name(server_config: str, change: Change) -> str:
    """The proposed configuration's name in a confirmation experiment: the diagnosed one's
    with the change, e.g. max-num-seqs-1.max-num-seqs-8 (a directory name: [A-Za-z0-9._-])."""
    key, value = next(iter(change.items()))
    if key == "compilation-config":
        sizes = json.loads(str(value))["cudagraph_capture_sizes"]
        return f"{server_config}.capture-{max(sizes)}"
    return f"{server_config}.{key}-{value}"


def _claim(metric: str, new: str, old: str, c: int | float, factor: float | None) -> str:
    k = f"{factor:g} * " if factor is not None else ""
    return f"{metric}[config={new},c={c:g}] > {k}{metric}[config={old},c={c:g}]"


def _levels_words(levels: list[int]) -> str:
    words = [str(c) for c in levels]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _max_num_seqs(d: Diagnosis, cap: Capacity, g: Groups) -> Proposal | NoRemedy:
    """serialized / kv_headroom_unused: raise --max-num-seqs to what the KV cache fits."""
    sc = d["server_config"]
    old = max_num_seqs(cap)
    fits = cap.get("max_concurrency")
    if not launched(cap):
        return NoRemedy(not_launched("--max-num-seqs"))
    if old is None:
        return NoRemedy("the startup log does not report --max-num-seqs: no value to raise")
    if not isinstance(fits, int | float) or isinstance(fits, bool):
        return NoRemedy(
            "the startup log does not say how many sequences the KV cache fits "
            "(no 'Maximum concurrency' line): no --max-num-seqs to propose that it can hold"
        )
    new = math.floor(fits)
    if new <= old:
        return NoRemedy(
            f"the KV cache fits {fits:g} sequences, no more than --max-num-seqs "
            f"{old} already allows: the limit is elsewhere"
        )
    if d["kind"] == "serialized":
        lo, hi = cast(FlatSpan, d["evidence"])["concurrency_span"]
        diagnosed = [int(c) for c in g.levels(sc) if lo <= c <= hi]
        why = (
            f"throughput is flat from concurrency {lo} to {hi} while --max-num-seqs is {old}; "
            f"the startup log says the KV cache fits {fits:g} sequences"
        )
    else:
        diagnosed = [int(c) for c in g.levels(sc)]
        why = (
            f"the startup log says the KV cache fits {fits:g} sequences of "
            f"{cap.get('max_concurrency_tokens_per_request')} tokens, but --max-num-seqs is {old}"
        )
    change: Change = {"max-num-seqs": new}
    name = proposed_name(sc, change)
    judged = [c for c in diagnosed if min(c, new) / old >= 2 * PROPOSED_MIN_RATIO]
    out: Proposal = {
        "server_config": sc,
        "change": change,
        "config": name,
        "concurrency": judged,
        "claims": [_claim("throughput", name, sc, c, PROPOSED_MIN_RATIO) for c in judged],
        "why": why,
        "expected": (
            f"output throughput at least {PROPOSED_MIN_RATIO:g}x {sc}'s at concurrency "
            f"{_levels_words(judged)}"
            if judged
            else f"output throughput at least {PROPOSED_MIN_RATIO:g}x {sc}'s"
        ),
        "tryable": bool(judged),
    }
    if not judged:
        out["not_tried"] = (
            f"no measured concurrency reaches {math.ceil(2 * PROPOSED_MIN_RATIO * old)}, "
            "where the change could triple throughput: measure higher concurrencies first"
        )
    return out


def _capture_sizes(d: Diagnosis, cap: Capacity, g: Groups) -> Proposal | NoRemedy:
    """non_monotonic: capture CUDA graphs for the measured batches the captured sizes miss."""
    if not launched(cap):
        return NoRemedy(not_launched("the list of CUDA graph capture sizes"))
    if d.get("outside_capture_sizes") is not True:
        return NoRemedy(
            "the CUDA graph capture sizes do not explain the dip (see "
            "capture_explanation): no setting to change; avoid this operating point"
        )
    sc = d["server_config"]
    sizes = [int(x) for x in cast(list[int], d["capture_sizes"])]
    mns = max_num_seqs(cap)
    batches = {min(int(c), mns) if mns is not None else int(c) for c in g.levels(sc)}
    batches.add(int(d["batch_size"]))
    new = sorted(set(sizes) | {b for b in batches if b > max(sizes)})
    sizes_json = json.dumps({"cudagraph_capture_sizes": new}, separators=(",", ":"))
    change: Change = {"compilation-config": sizes_json}
    name = proposed_name(sc, change)
    c = cast(int, d["concurrency"])
    return {
        "server_config": sc,
        "change": change,
        "config": name,
        "concurrency": [c],
        "claims": [_claim("throughput", name, sc, c, None)],
        "expected": f"the dip gone: output throughput above {sc}'s at concurrency {c}",
        "why": d["capture_explanation"],
        "tryable": True,
    }


def _operating_point(d: Diagnosis, axis: str) -> Proposal:
    """past_knee / dominated: operate at the knee or at the dominating level."""
    at = (
        cast(PastKneeEvidence, d["evidence"])["knee"]
        if d["kind"] == "past_knee"
        else dominance_levels(cast(DominanceRow, d["evidence"]), axis)[1]
    )
    word = "request rate" if axis == "rate" else "concurrency"
    return {
        "server_config": d["server_config"],
        "operate_at": {axis: at},
        "why": d["suggestion"],
        "expected": f"operated at {word} {at}: as much throughput, less latency",
        "tryable": False,
        "not_tried": "an operating point, not a server change: this sweep measured it "
        "already (knee.json, dominance.csv)",
    }


def with_proposal(d: Diagnosis, cap: Capacity, g: Groups) -> Diagnosis:
    """The diagnosis with its `proposal`, or with `no_remedy` (why there is none)."""
    kind = d["kind"]
    if kind in ("serialized", "kv_headroom_unused"):
        found = _max_num_seqs(d, cap, g)
    elif kind == "non_monotonic":
        found = _capture_sizes(d, cap, g)
    elif kind in ("past_knee", "dominated"):
        found = _operating_point(d, g.axis)
    else:
        found = NoRemedy(NO_REMEDY_UTILIZATION)
    if isinstance(found, NoRemedy):
        return {**d, "no_remedy": found.why}
    return {**d, "proposal": found}


def proposal_line(d: Diagnosis) -> str | None:
    """A diagnosis's proposal in one line, as `servelab analyze` prints it and the report
    reads it: the change, what it should buy, and whether a confirmation runs it."""
    p = d.get("proposal")
    if p is None:
        return f"no remedy: {d['no_remedy']}" if "no_remedy" in d else None
    if "change" in p:
        change = change_words(p["change"])
        text = f"proposal: {change} on {p['server_config']}; expected: {p['expected']}"
    else:
        axis, at = next(iter(p["operate_at"].items()))
        word = "request rate" if axis == "rate" else axis
        return f"proposal: operate at {word} {at:g} (measured by this sweep: nothing to confirm)"
    if not p["tryable"]:
        text += f" (not run by a confirmation: {p['not_tried']})"
    return text
