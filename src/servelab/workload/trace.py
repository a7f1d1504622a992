"""A timed request trace replayed (workload.trace): reading the trace, its window and filter,
the prompts that share the trace's prefix blocks, and the send schedule.

The trace is JSON lines in the Mooncake format (the FAST'25 Mooncake paper's traces, also
read by vLLM bench serve and GuideLLM): one request per line, `timestamp` (milliseconds after
the trace's start, non-decreasing), `input_length` and `output_length` (tokens) and, optionally,
`hash_ids`: the ids of the prompt's blocks of `block_tokens` tokens, in order (512 in Mooncake's
traces). Two requests with the same id at the same place share that block's tokens; a line
without `hash_ids` (the plain form) gets a prompt of its own. Other keys are ignored.

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
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TypedDict

from servelab.client.prompt import Prompt
from servelab.documents import JsonObject
from servelab.documents.declared import WindowJson
from servelab.errors import ServelabError
from servelab.experiment import DatasetFilter, DatasetSection, TraceSection
from servelab.store.jsonio import DamagedFile, json_object_line
from servelab.workload import datasets
from servelab.workload.datasets import DatasetFile

FORMAT_VERSION = 1
REASONS = ("over_model_len",)

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]


# --- the file --------------------------------------------------------------------------


def _as_dataset(spec: TraceSection) -> DatasetSection:
    nofilter = DatasetFilter(1, None, 1, None)
    return DatasetSection(spec.path, spec.hub, spec.sha256, "jsonl", nofilter, None)


def _renamed(exc: ServelabError) -> ServelabError:
    return ServelabError(str(exc).replace("workload.dataset", "workload.trace"))


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


@dataclass(frozen=True)
class TraceRow:
    """One request of the trace: its `timestamp` (ms, an int or a float), `input_length`,
    `output_length` and `hash_ids` (None: the plain form); `line`, its line in the file."""

    timestamp: int | float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None
    line: int


def _count(row: JsonObject, key: str, path: Path, lineno: int, low: int) -> int:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise DamagedFile(path, f"line {lineno}", f"{key}: {v!r} is not an integer >= {low}")
    return v


def read_trace(path: Path) -> list[TraceRow]:
    """The requests of a trace file, in file order: one JSON object per line (blank lines
    skipped), timestamps non-decreasing from 0 up. Anything else: a one-line DamagedFile naming
    the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, "$", f"not UTF-8 text ({exc.reason})") from None
    rows: list[TraceRow] = []
    last: int | float = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json_object_line(path, lineno, line, "a trace is one JSON object per line")
        ts = row.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise DamagedFile(path, f"line {lineno}", f"timestamp: {ts!r} is not a number (ms)")
        if ts < last:
            raise DamagedFile(
                path, f"line {lineno}", f"timestamp {ts!r} is before the line above's {last!r}"
            )
        last = ts
        ids = row.get("hash_ids")
        if ids is not None and (
            not isinstance(ids, list)
            or any(isinstance(h, bool) or not isinstance(h, int) for h in ids)
        ):
            raise DamagedFile(path, f"line {lineno}", "hash_ids: not a list of integers")
        rows.append(
            TraceRow(
                ts,
                _count(row, "input_length", path, lineno, 1),
                _count(row, "output_length", path, lineno, 1),
                None if ids is None else tuple(h for h in ids if isinstance(h, int)),
                lineno,
            )
        )
    if not rows:
        raise DamagedFile(path, "$", "no request: a trace is one JSON object per line")
    return rows


# --- the window ------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The requests a point replays: `rows` (kept), what the window held (`in_window`), why
    the others were left out (`rejected`), and its recorded span `duration_ms`."""

    rows: tuple[TraceRow, ...]
    in_window: int
    rejected: dict[str, int]
    start_ms: Fraction
    duration_ms: Fraction

    @property
    def recorded_rate(self) -> float:
        """The window's requests per second as recorded: in_window / its duration."""
        return float(self.in_window / (self.duration_ms / 1000))

    def time_scale(self, rate: float) -> float:
        """The time scale that replays the window at `rate` requests per second on average."""
        return self.recorded_rate / rate

    def record(self) -> WindowJson:
        """What trace.json and point.json keep of the window."""
        return {
            "start_s": float(self.start_ms / 1000),
            "duration_s": float(self.duration_ms / 1000),
            "in_window": self.in_window,
            "requests": len(self.rows),
            "rejected": dict(self.rejected),
            "recorded_rate": round(self.recorded_rate, 9),
        }


class TraceReuse(TypedDict):
    """What the trace means the prefix cache to serve over a point's requests
    (`intended_reuse`)."""

    block_tokens: int
    requests: int
    requests_with_reuse: int
    reused_tokens: int
    prompt_tokens: int
    reuse_ratio: float | None


def window(
    rows: Sequence[TraceRow], spec: TraceSection, model_len: int | None, special: int = 0
) -> Window:
    """The requests of workload.trace's window that fit the server: input_length + `special`
    (the tokens the server adds to a prompt) + output_length <= model_len. The window's
    duration is duration_s, or without it from start_s to the trace's last timestamp."""
    start = Fraction(spec.start_s) * 1000
    end = None if spec.duration_s is None else start + Fraction(spec.duration_s) * 1000
    inside = [
        r
        for r in rows
        if Fraction(r.timestamp) >= start and (end is None or Fraction(r.timestamp) < end)
    ]
    if not inside:
        raise ServelabError(
            f"workload.trace: no request between start_s {spec.start_s:g} and "
            + ("the trace's end" if end is None else f"{float(end) / 1000:g} s")
            + f" (the trace spans {float(rows[0].timestamp) / 1000:g}-"
            f"{float(rows[-1].timestamp) / 1000:g} s); move workload.trace.start_s"
        )
    duration = end - start if end is not None else Fraction(inside[-1].timestamp) - start
    if duration <= 0:
        raise ServelabError(
            "workload.trace: the window holds one instant of the trace; give duration_s"
        )
    rejected = dict.fromkeys(REASONS, 0)
    kept = []
    for r in inside:
        if model_len is not None and r.input_length + special + r.output_length > model_len:
            rejected["over_model_len"] += 1
        else:
            kept.append(r)
    if not kept:
        raise ServelabError(
            f"workload.trace: none of the window's {len(inside)} requests fits max-model-len "
            f"{model_len} (input + output); choose another window or a longer max-model-len"
        )
    return Window(tuple(kept), len(inside), rejected, start, duration)


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


def intended_reuse(rows: Sequence[TraceRow], block_tokens: int) -> TraceReuse:
    """What the trace means the prefix cache to serve over `rows` (a point's requests, in
    order, from an empty cache): a request's leading blocks that an earlier request sent at
    the same place (the same ids before them), each for the tokens both used."""
    seen: dict[tuple[int, ...], int] = {}  # block chain -> most tokens sent of its last block
    reused = total = with_reuse = 0
    for r in rows:
        total += r.input_length
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
        reused += hit
        with_reuse += hit > 0
    return {
        "block_tokens": block_tokens,
        "requests": len(rows),
        "requests_with_reuse": with_reuse,
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
