"""A timed request trace replayed (workload.trace): reading the trace, its window and filter,
the prompts that share the trace's prefix blocks, and the send schedule.

The trace is read into one request per row (`TraceRow`) from any of the formats of
servelab.workload.trace_formats (workload.trace.format): JSON lines in the Mooncake format (the
FAST'25 Mooncake paper's traces, also read by vLLM bench serve and GuideLLM), the Azure LLM
inference CSVs or the BurstGPT CSVs. A row is a request's `timestamp` (milliseconds after the
trace's first request, non-decreasing), `input_length` and `output_length` (tokens) and,
optionally (Mooncake's only), `hash_ids`: the ids of the prompt's blocks of `block_tokens`
tokens, in order (512 in Mooncake's traces). Two requests with the same id at the same place
share that block's tokens; a request without `hash_ids` (the plain form) gets a prompt of its
own.

The file is pinned like a dataset (servelab.workload.datasets: a path with its sha256, or a
hub file at a commit) before anything is read or any server starts.

The window: the requests with `start_s <= timestamp / 1000 < start_s + duration_s` (no
duration: to the trace's end). A request whose prompt and output exceed the server's
max-model-len is left out and counted (`over_model_len`), as a dataset's pairs are.

Prompts (`TraceBuilder`): every block id gets `block_tokens` token ids drawn from the model's
whole-word tokens (servelab.workload.synthetic.vocab_ids) with its own seeded stream, and a
request's prompt is the ids of its blocks in order, the last one cut to `input_length`; tokens
beyond its blocks (and every token of a plain request) come from the request's own stream. The
ids are turned into text with the server's /detokenize and the text is checked with its
/tokenize: it must give back exactly those ids, so that requests sharing a block id share those
tokens under the server's tokenizer and its prefix cache can see the reuse the trace recorded.
Each point sends its own copy of the window (a `salt` in every stream), so no point finds
another's blocks in the cache.

The schedule (`schedule_ns`): request i is sent at (timestamp_i - the window's start) x
time_scale after the point's start, rounded to the nanosecond. A trace point's level is a
request rate (sweep.rate): its time_scale is the window's recorded rate (its requests over its
duration) over that rate, so rate = k x the recorded rate replays the same traffic k times
faster.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TypedDict

from servelab.client.prompt import Prompt
from servelab.documents.declared import FitJson, TrafficJson, WindowJson
from servelab.errors import ServelabError
from servelab.experiment import DatasetFilter, DatasetSection, TraceSection
from servelab.experiment.workload import block_divisors, scale_fraction, scaled_block_tokens
from servelab.workload import datasets, trace_formats
from servelab.workload.datasets import DatasetFile
from servelab.workload.trace_formats import TraceRow as TraceRow

FORMAT_VERSION = 1
REASONS = ("over_model_len", "failed_in_trace")

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]


# --- the file --------------------------------------------------------------------------


def _as_dataset(spec: TraceSection) -> DatasetSection:
    nofilter = DatasetFilter(1, None, 1, None)
    return DatasetSection(spec.path, spec.hub, spec.sha256, "jsonl", nofilter, None)


def _renamed(exc: ServelabError) -> ServelabError:
    said = str(exc).replace("workload.dataset", "workload.trace")
    return ServelabError(
        said.replace(
            "give the dataset file's path",
            "give the trace file's path (an example replaying a public trace says in its "
            "header where to fetch it)",
        )
    )


def resolve_trace(spec: TraceSection) -> DatasetFile:
    """The pinned trace file, checked as a dataset file is (its sha256 against the pin, a hub
    file against the hub); errors name workload.trace."""
    try:
        return datasets.resolve_dataset(_as_dataset(spec))
    except ServelabError as exc:
        raise _renamed(exc) from None


def check_local_pin(spec: TraceSection | None) -> DatasetFile | None:
    """A trace named by path, checked against its pin now (at the workflow's start and in
    `servelab check-config`); None for no trace or one on the hub."""
    if spec is None or spec.hub is not None or spec.path is None:
        return None
    return resolve_trace(spec)


def read_trace(path: Path, fmt: str = "auto") -> list[TraceRow]:
    """The requests of a trace file in format `fmt` (workload.trace.format: auto, told from
    the file's content, or one of servelab.workload.trace_formats.FORMATS), in file order,
    timestamps non-decreasing from 0 up. Anything else: a one-line DamagedFile naming the file
    and the line."""
    return trace_formats.read_rows(path, fmt)


# --- scale ---------------------------------------------------------------------------


def scale_row(row: TraceRow, scale: float) -> TraceRow:
    """A request at length_scale: its input and output lengths x scale, rounded up (a request
    keeps at least one token of each block it touched, so its hash_ids and every shared prefix
    stay as they were; an output keeps at least 1 token). Scale 1 returns the row as it is."""
    f = scale_fraction(scale)
    if f == 1:
        return row
    return replace(
        row,
        input_length=max(1, math.ceil(row.input_length * f)),
        output_length=(
            row.output_length if row.failed else max(1, math.ceil(row.output_length * f))
        ),
    )


# --- the window ------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """How a window's requests were fitted to the server (workload.trace): lengths and
    block_tokens x `length_scale` (`block_tokens`: the replayed block), outputs capped at
    `max_output_tokens` (`capped` of them), requests still over max-model-len dropped or
    truncated (`over_limit`; `truncated` of them), and the share the replay must keep."""

    length_scale: float = 1.0
    block_tokens: int = 512
    max_output_tokens: int | None = None
    over_limit: str = "drop"
    capped: int = 0
    truncated: int = 0
    min_kept: float = 0.95

    def record(self) -> FitJson:
        return {
            "length_scale": self.length_scale,
            "block_tokens": self.block_tokens,
            "max_output_tokens": self.max_output_tokens,
            "over_limit": self.over_limit,
            "capped": self.capped,
            "truncated": self.truncated,
            "min_kept": self.min_kept,
        }


def _quantile(values: Sequence[int], q: float) -> int | None:
    """The nearest-rank q-quantile of `values` (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def traffic(rows: Sequence[TraceRow], duration_ms: Fraction, block_tokens: int) -> TrafficJson:
    """What a set of a window's requests is, for the report's original-against-replayed table:
    their rate over the window's duration (as recorded), input and output length p50 and p90
    (nearest rank; failed requests' outputs left out) and the reuse they imply at
    `block_tokens`."""
    done = [r for r in rows if not r.failed]
    return {
        "requests": len(rows),
        "rate": round(float(len(rows) / (duration_ms / 1000)), 9),
        "input_p50": _quantile([r.input_length for r in done], 0.5),
        "input_p90": _quantile([r.input_length for r in done], 0.9),
        "output_p50": _quantile([r.output_length for r in done], 0.5),
        "output_p90": _quantile([r.output_length for r in done], 0.9),
        "reuse_ratio": intended_reuse(done, block_tokens)["reuse_ratio"],
    }


@dataclass(frozen=True)
class Window:
    """The requests a point replays: `rows` (kept, fitted to the server), what the window held
    (`in_window`, and `original`: those requests as recorded), why the others were left out
    (`rejected`), its recorded span `duration_ms`, and how the kept ones were fitted (`fit`)."""

    rows: tuple[TraceRow, ...]
    in_window: int
    rejected: dict[str, int]
    start_ms: Fraction
    duration_ms: Fraction
    fit: Fit = Fit()
    original: tuple[TraceRow, ...] = ()
    trace_block_tokens: int = 512

    @property
    def block_tokens(self) -> int:
        """The replayed block: the trace's block_tokens x length_scale."""
        return self.fit.block_tokens

    @property
    def kept_share(self) -> float:
        """The share of the window's requests replayed."""
        return len(self.rows) / self.in_window

    @property
    def recorded_rate(self) -> float:
        """The window's requests per second as recorded: in_window / its duration."""
        return float(self.in_window / (self.duration_ms / 1000))

    def time_scale(self, rate: float) -> float:
        """The time scale that replays the window at `rate` requests per second on average."""
        return self.recorded_rate / rate

    def record(self) -> WindowJson:
        """What trace.json and point.json keep of the window: its span, counts and recorded
        rate; how it was fitted; its traffic as recorded and as replayed."""
        out: WindowJson = {
            "start_s": float(self.start_ms / 1000),
            "duration_s": float(self.duration_ms / 1000),
            "in_window": self.in_window,
            "requests": len(self.rows),
            "rejected": dict(self.rejected),
            "recorded_rate": round(self.recorded_rate, 9),
            "kept_share": round(self.kept_share, 6),
            "fit": self.fit.record(),
        }
        if self.original:
            out["original"] = traffic(self.original, self.duration_ms, self.trace_block_tokens)
            out["replayed"] = traffic(self.rows, self.duration_ms, self.block_tokens)
        return out


class TraceReuse(TypedDict):
    """What the trace means the prefix cache to serve over a point's requests
    (`intended_reuse`)."""

    block_tokens: int
    requests: int
    requests_with_reuse: int
    reused_tokens: int
    prompt_tokens: int
    reuse_ratio: float | None


def window_text(win: WindowJson) -> str:
    """A window's record in words, for the run's progress line: its span, the share of its
    requests replayed and why the others were left out, and how they were fitted."""
    start, dur = win["start_s"], win["duration_s"]
    said = f"window {start:g}-{start + dur:g} s: {win['requests']} of {win['in_window']} kept"
    left = [f"{v} {k}" for k, v in win["rejected"].items() if v]
    fit = win.get("fit")
    if fit is not None:
        if fit["length_scale"] != 1:
            said += f", lengths x {fit['length_scale']:g} (block {fit['block_tokens']} tokens)"
        if fit["capped"]:
            said += f", {fit['capped']} outputs capped at {fit['max_output_tokens']}"
        if fit["truncated"]:
            said += f", {fit['truncated']} inputs truncated"
    return said + (f"; left out: {', '.join(left)}" if left else "")


def _bounds(rows: Sequence[TraceRow], spec: TraceSection) -> tuple[Fraction, Fraction | None]:
    """The window's start and end (ms; None: the trace's end): `busiest` seconds where given,
    else start_s and duration_s."""
    if spec.busiest is not None:
        from servelab.workload.trace_stats import busiest_start_ms

        start = Fraction(busiest_start_ms(rows, spec.busiest))
        return start, start + Fraction(spec.busiest) * 1000
    start = Fraction(spec.start_s) * 1000
    end = None if spec.duration_s is None else start + Fraction(spec.duration_s) * 1000
    return start, end


def fit_row(
    row: TraceRow, spec: TraceSection, model_len: int | None, special: int
) -> tuple[TraceRow | None, str]:
    """One request fitted to the server: scaled (length_scale), its output capped
    (max_output_tokens) and, still over max-model-len (input + `special` + output), dropped
    (None) or its input truncated (over_limit). The second value says what was done: "",
    "capped", "truncated", "capped+truncated" or "over_model_len"."""
    r = scale_row(row, spec.length_scale)
    done: list[str] = []
    cap = spec.max_output_tokens
    if cap is not None and r.output_length > cap:
        r = replace(r, output_length=cap)
        done.append("capped")
    if model_len is not None and r.input_length + special + r.output_length > model_len:
        room = model_len - special - r.output_length
        if spec.over_limit != "truncate" or room < 1:
            return None, "over_model_len"
        r = replace(r, input_length=room)
        done.append("truncated")
    return r, "+".join(done)


def _fitted(
    inside: Sequence[TraceRow], spec: TraceSection, model_len: int | None, special: int
) -> tuple[list[TraceRow], dict[str, int], Fit]:
    rejected = dict.fromkeys(REASONS, 0)
    kept: list[TraceRow] = []
    capped = truncated = 0
    for r in inside:
        if r.failed:
            rejected["failed_in_trace"] += 1
            continue
        fitted, done = fit_row(r, spec, model_len, special)
        if fitted is None:
            rejected[done] += 1
            continue
        capped += "capped" in done
        truncated += "truncated" in done
        kept.append(fitted)
    fit = Fit(
        spec.length_scale,
        scaled_block_tokens(spec.block_tokens, spec.length_scale),
        spec.max_output_tokens,
        spec.over_limit,
        capped,
        truncated,
        spec.min_kept,
    )
    return kept, rejected, fit


def suggest_scale(
    inside: Sequence[TraceRow], spec: TraceSection, model_len: int | None, special: int
) -> tuple[float, float] | None:
    """The largest length_scale of the form 1/d (d a divisor of block_tokens, no larger than
    the scale given) that keeps at least min_kept of `inside`, with the share it keeps; None
    when none does."""
    n = len(inside)
    for d in block_divisors(spec.block_tokens):
        scale = 1 / d
        if scale > spec.length_scale:
            continue
        kept, _, _ = _fitted(inside, replace(spec, length_scale=scale), model_len, special)
        if len(kept) >= spec.min_kept * n:
            return scale, len(kept) / n
    return None


def window(
    rows: Sequence[TraceRow], spec: TraceSection, model_len: int | None, special: int = 0
) -> Window:
    """The requests of workload.trace's window (start_s and duration_s, or the busiest
    `busiest` seconds), fitted to the server (fit_row): failed requests of the trace and those
    still over max-model-len (input_length + `special`, the tokens the server adds to a prompt,
    + output_length) are left out and counted. The window's duration is duration_s, or without
    it from start_s to the trace's last timestamp. Fewer than min_kept of its requests kept:
    refused in one line naming a length_scale that keeps them."""
    start, end = _bounds(rows, spec)
    inside = [
        r
        for r in rows
        if Fraction(r.timestamp) >= start and (end is None or Fraction(r.timestamp) < end)
    ]
    if not inside:
        raise ServelabError(
            f"workload.trace: no request between start_s {float(start) / 1000:g} and "
            + ("the trace's end" if end is None else f"{float(end) / 1000:g} s")
            + f" (the trace spans {float(rows[0].timestamp) / 1000:g}-"
            f"{float(rows[-1].timestamp) / 1000:g} s); move workload.trace.start_s"
        )
    duration = end - start if end is not None else Fraction(inside[-1].timestamp) - start
    if duration <= 0:
        raise ServelabError(
            "workload.trace: the window holds one instant of the trace; give duration_s"
        )
    kept, rejected, fit = _fitted(inside, spec, model_len, special)
    if len(kept) < spec.min_kept * len(inside):
        raise ServelabError(_too_few(inside, kept, rejected, spec, model_len, special))
    return Window(
        tuple(kept), len(inside), rejected, start, duration, fit, tuple(inside), spec.block_tokens
    )


def _too_few(
    inside: Sequence[TraceRow],
    kept: Sequence[TraceRow],
    rejected: Mapping[str, int],
    spec: TraceSection,
    model_len: int | None,
    special: int,
) -> str:
    """The one-line refusal of a window that keeps fewer than min_kept of its requests."""
    n = len(inside)
    why = ", ".join(f"{v} {k}" for k, v in rejected.items() if v)
    said = (
        f"workload.trace: the replay keeps {len(kept)} of the window's {n} requests "
        f"({100 * len(kept) / n:.0f}%; left out: {why}), under min_kept {spec.min_kept:g}"
    )
    if rejected.get("failed_in_trace", 0) > (1 - spec.min_kept) * n:
        failed = rejected["failed_in_trace"]
        return f"{said}: the trace records {failed} as failed; lower min_kept or move the window"
    found = suggest_scale(inside, spec, model_len, special)
    if found is not None:
        scale, share = found
        return (
            f"{said} at max-model-len {model_len}: set workload.trace.length_scale: {scale:g} "
            f"(1/{round(1 / scale)}: keeps {100 * share:.0f}%), over_limit: truncate, "
            "or a longer max-model-len"
        )
    return f"{said}: set over_limit: truncate, or a longer max-model-len, or lower min_kept"


def schedule_ns(win: Window, time_scale: float) -> list[int]:
    """Each kept request's send time, ns after the point's start: (timestamp - the window's
    start) x time_scale, rounded to the nanosecond (half to even), computed exactly."""
    scale = Fraction(time_scale)
    return [round((Fraction(r.timestamp) - win.start_ms) * 1_000_000 * scale) for r in win.rows]


# --- the prompts -----------------------------------------------------------------------


def blocks_of(row: TraceRow, block_tokens: int) -> list[tuple[int, int]]:
    """(hash id, tokens used) of each block a request's prompt starts with: every id whose
    block holds part of its input_length, the last one cut; none in the plain form."""
    out: list[tuple[int, int]] = []
    left = row.input_length
    for h in row.hash_ids or ():
        if left <= 0:
            break
        out.append((h, min(block_tokens, left)))
        left -= block_tokens
    return out


def reuse_per_row(rows: Sequence[TraceRow], block_tokens: int) -> list[int]:
    """Per request of `rows` (in order, from an empty cache), the prompt tokens an earlier one
    sent at the same place: its leading blocks that an earlier request sent after the same ids,
    each for the tokens both used."""
    seen: dict[tuple[int, ...], int] = {}  # block chain -> most tokens sent of its last block
    out: list[int] = []
    for r in rows:
        chain: tuple[int, ...] = ()
        hit, reusing = 0, True
        for h, n in blocks_of(r, block_tokens):
            chain = (*chain, h)
            before = seen.get(chain, 0)
            if reusing and before:
                hit += min(n, before)
                reusing = before >= n
            else:
                reusing = False
            seen[chain] = max(before, n)
        out.append(hit)
    return out


def intended_reuse(rows: Sequence[TraceRow], block_tokens: int) -> TraceReuse:
    """What the trace means the prefix cache to serve over `rows` (a point's requests, in
    order, from an empty cache): reuse_per_row summed."""
    hits = reuse_per_row(rows, block_tokens)
    reused, total = sum(hits), sum(r.input_length for r in rows)
    return {
        "block_tokens": block_tokens,
        "requests": len(rows),
        "requests_with_reuse": sum(h > 0 for h in hits),
        "reused_tokens": reused,
        "prompt_tokens": total,
        "reuse_ratio": round(reused / total, 6) if total else None,
    }


@dataclass
class TraceBuilder:
    """Builds a trace's prompts with the server's tokenizer (`tokenize` without special
    tokens, `detokenize`) from the model's whole-word token ids `vocab`, seeded by `seed`.
    `special`: the tokens the server adds to a prompt (a BOS token), counted in each prompt's
    `input_tokens` as the server counts its prompt."""

    vocab: Sequence[int]
    seed: int
    block_tokens: int
    tokenize: Tokenize
    detokenize: Detokenize
    special: int = 0

    def __post_init__(self) -> None:
        self._blocks: dict[str, list[int]] = {}
        self._ok: dict[int, bool] = {}

    def _round_trips(self, i: int) -> bool:
        """The id's text tokenizes back to the id alone (asked of the server once per id)."""
        ok = self._ok.get(i)
        if ok is None:
            ok = self._ok[i] = self.tokenize(self.detokenize([i])) == [i]
        return ok

    def _draw(self, key: str, n: int) -> list[int]:
        """n ids of the stream `key` that each tokenize back to themselves (an id that does
        not is skipped)."""
        rng = random.Random(f"{self.seed}:trace:{key}")
        ids: list[int] = []
        while len(ids) < n:
            i = rng.choice(self.vocab)
            if self._round_trips(i):
                ids.append(i)
        return ids

    def block(self, salt: str, hash_id: int) -> list[int]:
        """The block_tokens ids of one block id (the same for every request of a copy)."""
        key = f"{salt}:block:{hash_id}"
        ids = self._blocks.get(key)
        if ids is None:
            ids = self._blocks[key] = self._draw(key, self.block_tokens)
        return ids

    def ids(self, row: TraceRow, index: int, salt: str) -> list[int]:
        """The token ids of a request's prompt: its blocks', then its own."""
        out: list[int] = []
        for h, n in blocks_of(row, self.block_tokens):
            out += self.block(salt, h)[:n]
        if row.input_length > len(out):
            out += self._draw(f"{salt}:own:{index}", row.input_length - len(out))
        return out

    def prompt(self, row: TraceRow, index: int, salt: str) -> Prompt:
        """A request's prompt: the text of its ids, checked to tokenize back to exactly them."""
        ids = self.ids(row, index, salt)
        text = self.detokenize(ids)
        got = self.tokenize(text)
        if got != ids:
            raise ServelabError(
                f"workload.trace: the prompt of trace line {row.line} does not tokenize back "
                f"to its {len(ids)} tokens ({len(got)}); the model's tokenizer merges across "
                "words, so it cannot carry the trace's shared blocks"
            )
        n = len(ids) + self.special
        return Prompt(text, max_tokens=row.output_length, input_tokens=n)

    def replay(self, win: Window, salt: str) -> list[Prompt]:
        """The window's prompts for one point (`salt`: its own copy of every block)."""
        return [self.prompt(r, i, salt) for i, r in enumerate(win.rows)]


def _part(record: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A record's object at `key` ({} where it has none)."""
    value = record.get(key)
    return value if isinstance(value, Mapping) else {}


def same_trace(a: Mapping[str, object], b: Mapping[str, object]) -> str | None:
    """None when two trace records (raw/<sc>/trace.json) replay the same trace the same way:
    the file's sha256, the seed, block_tokens and the window (its start, duration and the
    requests kept); else the first difference, in one line."""
    sa, sb = _part(a, "file").get("sha256"), _part(b, "file").get("sha256")
    if sa != sb:
        return f"trace sha256 {str(sa)[:12]} vs {str(sb)[:12]}"
    for key in ("seed", "block_tokens"):
        if a.get(key) != b.get(key):
            return f"{key} differs: {a.get(key)} vs {b.get(key)}"
    wa, wb = _part(a, "window"), _part(b, "window")
    for key in ("start_s", "duration_s", "requests"):
        if wa.get(key) != wb.get(key):
            return f"window {key} differs: {wa.get(key)} vs {wb.get(key)}"
    return None
