"""Same outputs: did the two sides of a comparison give the same answers?

A comparison of two server configurations or runtimes can set a fast wrong server against a
slow right one: speculative decoding, quantization or a scheduling bug can change the tokens
a server generates. The client sends temperature 0 (greedy decoding), and both sides of a
comparison send the same prompts in the same order at each point (one workload seed), so a
server that computes what the other does answers every prompt with the same tokens.

With `workload.record_output_ids` the client asks for each request's generated token ids
(vLLM's `return_token_ids`) and keeps them in requests.jsonl.gz (`output_ids`). Each completed
request is matched with the other side's request of the same prompt: the same repeat and
level, and the same place in the point (its index in the request id; a slice's and a chat
turn's number where the id has them). `same_outputs` counts, over the pairs both sides
recorded, the identical completions, and for each differing one the first token where they part
(counted from 1, the first generated token; where one completion is the other's beginning, the
token after the shorter one's end). A request that failed, or whose ids the server did not
return, is in no pair.

A comparison whose share of differing completions exceeds `analysis.max_differing_outputs_pct`
(0 by default: any) says so in its verdict ("..., but 12% of completions differ"): its speed
was measured on servers that did not compute the same thing.
"""

from __future__ import annotations

import re
import statistics
from array import array
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from servelab.design.level import LevelValue
from servelab.documents.declared import ClaimVerdict, SameOutputsJson
from servelab.store.request import RequestRecord

# a request's place in its point: (slice or None, index, chat turn or None)
RequestKey = tuple[int | None, int, int | None]
# one point's completions that carry their token ids, by their place in it
PointOutputs = Mapping[RequestKey, Sequence[int]]
# a point of a configuration: (repeat, level)
PointKey = tuple[int, LevelValue]
# every recorded point of every configuration: server config -> (repeat, level) -> outputs
RunOutputs = Mapping[str, Mapping[PointKey, PointOutputs]]

# what matches a completion with the other side's: the prompt it answers
K = TypeVar("K", bound=Hashable)

NOT_RECORDED = (
    "not recorded (workload.record_output_ids is off, or the server returned no token ids)"
)
# `<label>[-s<slice>]-<index>[-t<turn>]`: client.closed_loop's and client.chat's request ids
_PLACE = re.compile(r"(?:-s(\d+))?-(\d+)(?:-t(\d+))?$")


def request_key(request_id: str) -> RequestKey | None:
    """A request's place in its point from its id (None: an id of no form the client writes)."""
    m = _PLACE.search(request_id)
    if m is None:
        return None
    sl, index, turn = m.groups()
    return (None if sl is None else int(sl), int(index), None if turn is None else int(turn))


def point_outputs(records: Iterable[RequestRecord]) -> dict[RequestKey, Sequence[int]]:
    """The completed requests of one point that carry their output's token ids, by place;
    each kept as 8-byte integers (a run's dataset holds every point's), a request whose ids do
    not fit left out."""
    out: dict[RequestKey, Sequence[int]] = {}
    for r in records:
        key = request_key(r.request_id)
        if r.ok and r.output_ids is not None and key is not None:
            try:
                out[key] = array("q", r.output_ids)
            except OverflowError:
                continue
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first token position (from 1) where `a` and `b` differ; None when they are equal.
    Where one is the other's beginning, the token after the shorter one's end."""
    for k, (x, y) in enumerate(zip(a, b, strict=False), 1):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def _pct(part: int, whole: int) -> str:
    """A share in percent, as few decimals as keep a share that is not 0 or 100 off them."""
    p = 100.0 * part / whole
    text = f"{p:.0f}"
    for digits in range(1, 4):
        if part in (0, whole) or float(text) not in (0.0, 100.0):
            break
        text = f"{p:.{digits}f}"
    return f"{text}%"


@dataclass(frozen=True)
class SameOutputs:
    """Two sides' completions compared: `pairs` matched completions both sides recorded,
    `identical` of them the same token for token; `first` the first differing token of each
    other pair (from 1), in the pairs' order; `a_recorded` and `b_recorded` the completions
    each side recorded, matched or not."""

    pairs: int
    identical: int
    first: tuple[int, ...]
    a_recorded: int
    b_recorded: int

    @property
    def recorded(self) -> bool:
        """Either side recorded a completion's token ids."""
        return self.a_recorded > 0 or self.b_recorded > 0

    @property
    def differing(self) -> int:
        return self.pairs - self.identical

    @property
    def differing_pct(self) -> float | None:
        """The share of the pairs that differ, in percent (None: no pair)."""
        return 100.0 * self.differing / self.pairs if self.pairs else None

    def beyond(self, max_pct: float) -> bool:
        """More than `max_pct` percent of the pairs differ (analysis.max_differing_outputs_pct)."""
        pct = self.differing_pct
        return pct is not None and pct > max_pct

    def text(self) -> str:
        """One line: 'same_outputs: 58 of 60 completions identical (97%); 2 differ, first at
        token 3 (median 5)'."""
        if not self.recorded:
            return f"same_outputs: {NOT_RECORDED}"
        if not self.pairs:
            return (
                f"same_outputs: no completion recorded on both sides "
                f"(A {self.a_recorded}, B {self.b_recorded})"
            )
        line = (
            f"same_outputs: {self.identical} of {self.pairs} completions identical "
            f"({_pct(self.identical, self.pairs)})"
        )
        if self.first:
            n = len(self.first)
            line += f"; {n} differ{'s' if n == 1 else ''}, first at token {min(self.first)}"
            if n > 1:
                line += f" (median {statistics.median(self.first):g})"
        return line

    def to_json(self, max_pct: float) -> SameOutputsJson:
        """The block of a comparison's document (runtimes, same_host.json), judged at
        `max_pct` (analysis.max_differing_outputs_pct)."""
        return {
            "pairs": self.pairs,
            "identical": self.identical,
            "differing": self.differing,
            "a_recorded": self.a_recorded,
            "b_recorded": self.b_recorded,
            "differing_pct": self.differing_pct,
            "first_differing_token_min": min(self.first) if self.first else None,
            "first_differing_token_median": (
                float(statistics.median(self.first)) if self.first else None
            ),
            "max_differing_outputs_pct": max_pct,
            "beyond": self.beyond(max_pct),
            "text": self.text(),
        }


def same_outputs(
    side_a: Mapping[K, Sequence[int]], side_b: Mapping[K, Sequence[int]]
) -> SameOutputs:
    """Each side's completions by the prompt they answer (any key both sides share: a
    request's place in its point, with the point's repeat and level), compared pair by pair
    in the order of A's keys."""
    identical = 0
    first: list[int] = []
    for key, ids in side_a.items():
        other = side_b.get(key)
        if other is None:
            continue
        k = first_difference(ids, other)
        if k is None:
            identical += 1
        else:
            first.append(k)
    return SameOutputs(identical + len(first), identical, tuple(first), len(side_a), len(side_b))


def side_of(run: RunOutputs, sc: str) -> dict[Hashable, Sequence[int]]:
    """A configuration's recorded completions, each keyed by (repeat, level, place)."""
    points = run.get(sc, {})
    return {
        (repeat, level, *place): ids
        for (repeat, level), outputs in sorted(points.items())
        for place, ids in sorted(outputs.items(), key=lambda kv: _sortable(kv[0]))
    }


def _sortable(key: RequestKey) -> tuple[int, int, int]:
    sl, index, turn = key
    return (-1 if sl is None else sl, index, -1 if turn is None else turn)


def config_outputs(run: RunOutputs, a: str, b: str) -> SameOutputs:
    """Configuration B's completions against A's, at every point both recorded."""
    return same_outputs(side_of(run, a), side_of(run, b))


@dataclass(frozen=True)
class OutputsAsk:
    """What a comparison's document asks of the outputs: the run's recorded completions and
    the share that may differ (analysis.max_differing_outputs_pct)."""

    run: RunOutputs
    max_pct: float

    def block(self, a: str, b: str) -> SameOutputsJson | None:
        """B's completions against A's as a document's block; None where neither recorded any."""
        found = config_outputs(self.run, a, b)
        return found.to_json(self.max_pct) if found.recorded else None


@dataclass(frozen=True)
class ComparedOutputs:
    """One compared pair of configurations (A the reference) and its completions compared,
    judged at analysis.max_differing_outputs_pct (`block`)."""

    a: str
    b: str
    block: SameOutputsJson


def compared_pairs(
    configs: Sequence[str], named: Iterable[tuple[str, str]] = ()
) -> list[tuple[str, str]]:
    """The pairs of configurations whose outputs the report compares: the first configuration
    (the reference, as in "Runtimes compared") against each other one, then each pair `named`
    elsewhere (analysis.compare, a claim that compares two configurations) not yet listed
    either way round, in order."""
    out: list[tuple[str, str]] = [(configs[0], sc) for sc in configs[1:]] if configs else []
    seen = {frozenset(p) for p in out}
    for a, b in named:
        if a != b and a in configs and b in configs and frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            out.append((a, b))
    return out


def outputs_compared(
    ask: OutputsAsk, configs: Sequence[str], named: Iterable[tuple[str, str]] = ()
) -> list[ComparedOutputs] | None:
    """Every compared pair's outputs (`compared_pairs`); None where no point recorded any
    output's token ids (a run without workload.record_output_ids has no such section)."""
    if not any(outputs for points in ask.run.values() for outputs in points.values()):
        return None
    return [
        ComparedOutputs(a, b, config_outputs(ask.run, a, b).to_json(ask.max_pct))
        for a, b in compared_pairs(configs, named)
    ]


def claim_configs(claim: ClaimVerdict) -> tuple[str, str] | None:
    """The two configurations a claim compares (its evidence's sides), None for a claim on
    one configuration or of another kind."""
    evidence = claim.get("evidence")
    if not isinstance(evidence, Mapping):
        return None
    sides = [evidence.get(k) for k in ("a", "b")]
    names = [s.get("config") if isinstance(s, Mapping) else None for s in sides]
    a, b = names
    if isinstance(a, str) and isinstance(b, str) and a != b:
        return a, b
    return None


def claim_note(claim: ClaimVerdict, compared: Sequence[ComparedOutputs] | None) -> str:
    """What a claim comparing two configurations adds to its verdict when their completions
    differ beyond the threshold (`but_differ`); "" otherwise."""
    pair = claim_configs(claim)
    if pair is None or not compared:
        return ""
    for c in compared:
        if frozenset((c.a, c.b)) == frozenset(pair):
            return but_differ(c.block)
    return ""


def but_differ(block: SameOutputsJson | None) -> str:
    """What a verdict adds when its sides' completions differ beyond the threshold: ', but 12%
    of completions differ' ("" otherwise)."""
    if block is None or not block["beyond"] or block["differing_pct"] is None:
        return ""
    return f", but {_pct(block['differing'], block['pairs'])} of completions differ"


def with_outputs(verdict: str, block: SameOutputsJson | None) -> str:
    """A verdict line with `but_differ` before its closing full stop, if any."""
    note = but_differ(block)
    if not note:
        return verdict
    return verdict[:-1] + note + "." if verdict.endswith(".") else verdict + note


def outputs_line(block: SameOutputsJson | None) -> str:
    """The line a comparison shows under its verdict: the block's text, and whether the share
    that differs is beyond the threshold; 'not recorded' without a block."""
    if block is None:
        return f"Same outputs: {NOT_RECORDED}."
    line = f"Same outputs: {block['text'].removeprefix('same_outputs: ')}."
    if block["beyond"]:
        line += (
            f" More than analysis.max_differing_outputs_pct "
            f"({block['max_differing_outputs_pct']:g}%) differ: the two sides did not give the "
            "same answers, and their speeds are not those of the same computation."
        )
    return line


def outputs_section(compared: Sequence[ComparedOutputs] | None) -> list[str]:
    """The report's "Same outputs" section: one line per compared pair of configurations
    (none where no point recorded output token ids, or a run of one configuration)."""
    if not compared:
        return []
    limit = f"{compared[0].block['max_differing_outputs_pct']:g}%"
    lines = [
        "",
        "## Same outputs",
        "",
        "Each compared pair of configurations, B against A: of the completions both recorded "
        "(workload.record_output_ids) for the same prompt (same repeat, level and place in the "
        "point; temperature 0), how many are identical token for token, and where the first "
        f"differing ones part. More than {limit} differing "
        "(analysis.max_differing_outputs_pct) marks the pair and every verdict that compares it.",
        "",
    ]
    lines += [f"- {c.b} against {c.a}: {outputs_line(c.block)}" for c in compared]
    return lines
