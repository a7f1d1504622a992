"""Per-turn metrics of multi-turn chat points (workload.chat; client.chat): TTFT, TPOT and prompt
tokens by turn, and what each conversation took, per server configuration and level.

Turn k of a conversation re-sends every earlier turn and reply, so its prompt grows with k, and
its TTFT with it unless the prefix cache serves the history: the per-point tables pool every
turn, this one separates them. Only requests whose record carries `turn` count (docs/raw-data.md);
raw data without them gives nothing (`{}`), and the analysis writes no turns.json for it.

- `turn_tables(points, axis)`: the rows, a pure function of the points' requests (in the order
  given, which the reader keeps in folder order: same raw data, same rows);
- `turns_of(ds)`: the tables of the chat points the dataset read (Dataset.turn_points: only the
  points it kept; a point whose TTFT a failed validity check leaves out of the statistics is
  counted in `left_out` and contributes nothing else);
- `turns_section(tables, axis)`: the report's "TTFT by turn" section.

TTFT and TPOT are those of every table (servelab.metrics.request_latencies: TTFT at the first
content chunk with output), over successful requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from servelab.analysis.dataset import Dataset, TurnPoint
from servelab.analysis.groups import axis_of
from servelab.client import RequestRecord
from servelab.design.level import LevelValue
from servelab.metrics import request_end_ns, request_latencies
from servelab.render import md_table, num

# the columns of turns.json's two tables (the level's column named for the sweep's axis)
TURN_COLUMNS = (
    "server_config",
    "concurrency",
    "turn",
    "repeats",
    "left_out",
    "requests",
    "completed",
    "mean_ttft_ms",
    "p50_ttft_ms",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "mean_prompt_tokens",
    "mean_cached_tokens",
)
CONVERSATION_COLUMNS = (
    "server_config",
    "concurrency",
    "repeats",
    "left_out",
    "conversations",
    "completed",
    "turns_completed",
    "mean_turns_completed",
    "mean_duration_s",
)


# a row of turns.json's `turns` or `conversations`: the config, the level (keyed by the sweep's
# axis), the repeats and those left out, and TurnStats or ConversationStats
TurnRow = dict[str, object]


def turns_of(ds: Dataset) -> dict[str, list[TurnRow]]:
    """turns.json for the dataset: `turn_tables` of its chat points ({} without any), as the
    dataset read them (Dataset.turn_points: only the points it kept; a point whose TTFT a
    failed validity check leaves out of the statistics is counted in `left_out` and contributes
    nothing else)."""
    return turn_tables(ds.turn_points, axis_of(ds))


@dataclass
class _Level:
    """What one (server config, level) gathered: its points and, per turn and conversation,
    their requests."""

    repeats: set[int]
    left_out: set[int]
    turns: dict[int, list[RequestRecord]]
    conversations: dict[tuple[int, int], list[RequestRecord]]  # (repeat, conversation)


def turn_tables(points: Iterable[TurnPoint], axis: str = "concurrency") -> dict[str, list[TurnRow]]:
    """`turns`: one row per server config, level and turn (TURN_COLUMNS); `conversations`: one
    row per server config and level (CONVERSATION_COLUMNS); the level's column is named
    `axis`. Rows sorted by config, level and turn. {} when no request carries a turn."""
    levels: dict[tuple[str, LevelValue], _Level] = {}
    for p in points:
        chat = [r for r in p.records if r.turn is not None]
        if not chat:
            continue
        g = levels.setdefault((p.server_config, p.level), _Level(set(), set(), {}, {}))
        if p.left_out:
            g.left_out.add(p.repeat)
            continue
        g.repeats.add(p.repeat)
        for r in chat:
            assert r.turn is not None
            g.turns.setdefault(r.turn, []).append(r)
            g.conversations.setdefault((p.repeat, r.conversation or 0), []).append(r)
    if not levels:
        return {}
    turns: list[TurnRow] = []
    conversations: list[TurnRow] = []
    for (sc, level), g in sorted(levels.items()):
        head: TurnRow = {"server_config": sc, axis: level, "repeats": len(g.repeats),
                         "left_out": len(g.left_out)}  # fmt: skip
        for k in sorted(g.turns):
            turns.append({**head, "turn": k, **_turn_stats(g.turns[k])})
        conversations.append({**head, **_conversation_stats(list(g.conversations.values()))})
    return {"turns": turns, "conversations": conversations}


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(np.asarray(xs, dtype=np.float64))) if xs else None


class TurnStats(TypedDict):
    """One turn's requests (turns.json `turns`, beside the config, level and turn)."""

    requests: int
    completed: int
    mean_ttft_ms: float | None
    p50_ttft_ms: float | None
    p90_ttft_ms: float | None
    mean_tpot_ms: float | None
    mean_prompt_tokens: float | None
    mean_cached_tokens: float | None


class ConversationStats(TypedDict):
    """One level's conversations (turns.json `conversations`, beside the config and level)."""

    conversations: int
    completed: int
    turns_completed: int
    mean_turns_completed: float | None
    mean_duration_s: float | None


def _turn_stats(records: Sequence[RequestRecord]) -> TurnStats:
    """One turn's requests: how many, how many succeeded, and over those the TTFT mean, p50
    and p90, the mean TPOT, prompt tokens and cached prompt tokens (ms, tokens)."""
    good = [r for r in records if r.ok and r.chunk_offsets_us]
    lat = [request_latencies(r) for r in good]
    ttft = np.asarray([x["ttft"] for x in lat], dtype=np.float64)
    tpot = [float(x["tpot"]) for x in lat if x["tpot"] is not None]
    prompt = [float(r.prompt_tokens) for r in good if r.prompt_tokens is not None]
    cached = [float(r.cached_tokens) for r in good if r.cached_tokens is not None]
    have = ttft.size > 0
    return {
        "requests": len(records),
        "completed": len(good),
        "mean_ttft_ms": float(ttft.mean()) if have else None,
        "p50_ttft_ms": float(np.percentile(ttft, 50)) if have else None,
        "p90_ttft_ms": float(np.percentile(ttft, 90)) if have else None,
        "mean_tpot_ms": _mean(tpot),
        "mean_prompt_tokens": _mean(prompt),
        "mean_cached_tokens": _mean(cached),
    }


def _conversation_stats(conversations: Sequence[Sequence[RequestRecord]]) -> ConversationStats:
    """The conversations of one level: how many; completed, every turn of them ok; the turns
    completed (ok), in all and per conversation; and the mean duration (s) of the completed
    ones, from the first turn's send to the last turn's end."""
    done = [c for c in conversations if all(r.ok for r in c)]
    ok_turns = [sum(r.ok for r in c) for c in conversations]
    durations = [
        (max(request_end_ns(r) for r in c) - min(r.sent_epoch_ns for r in c)) / 1e9 for c in done
    ]
    return {
        "conversations": len(conversations),
        "completed": len(done),
        "turns_completed": sum(ok_turns),
        "mean_turns_completed": _mean([float(n) for n in ok_turns]),
        "mean_duration_s": _mean(durations),
    }


# --- the report -------------------------------------------------------------------------------

_LEVEL_HEADER = {"concurrency": "Concurrency", "rate": "Rate (req/s)"}


def _ms(x: object) -> str:
    """A latency in ms, or in s from one second on (as the report's other tables)."""
    if not isinstance(x, int | float):
        return num(x)
    return f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.1f} ms"


def _s(x: object) -> str:
    return f"{x:.2f} s" if isinstance(x, int | float) else num(x)


def turns_section(tables: dict[str, list[TurnRow]], axis: str) -> list[str]:
    """report.md's "TTFT by turn": per server config, a row per level and turn, then its
    conversations; no section (no lines) without chat points. Its lines end with a blank one,
    as the throughput section's, which it follows."""
    if not tables:
        return []
    level = _LEVEL_HEADER[axis]
    lines = [
        "## TTFT by turn",
        "",
        "Multi-turn chat: turn k re-sends the k - 1 turns before it and their replies, so its "
        "prompt grows with k, and its TTFT with it where the prefix cache does not serve the "
        "history. Over the successful requests of each turn, the repeats pooled (a repeat "
        "whose TTFT a failed validity check leaves out is only counted).",
        "",
    ]
    configs = sorted({str(r["server_config"]) for r in tables["conversations"]})
    for sc in configs:
        rows = [
            [
                r[axis],
                r["turn"],
                f"{r['completed']} of {r['requests']}",
                _ms(r["mean_ttft_ms"]),
                _ms(r["p50_ttft_ms"]),
                _ms(r["p90_ttft_ms"]),
                _ms(r["mean_tpot_ms"]),
                num(r["mean_prompt_tokens"], ",.1f"),
            ]
            for r in tables["turns"]
            if r["server_config"] == sc
        ]
        header = [level, "Turn", "Completed", "Mean TTFT", "p50 TTFT", "p90 TTFT", "Mean TPOT",
                  "Mean prompt tokens"]  # fmt: skip
        lines += [f"### {sc}", ""]
        lines += md_table(header, rows, align="rrrrrrrr")
        convs = [
            [
                r[axis],
                r["repeats"],
                r["conversations"],
                r["completed"],
                num(r["mean_turns_completed"], ".2f"),
                _s(r["mean_duration_s"]),
            ]
            for r in tables["conversations"]
            if r["server_config"] == sc
        ]
        header = [level, "Repeats", "Conversations", "Completed", "Mean turns completed",
                  "Mean duration"]  # fmt: skip
        lines += ["", *md_table(header, convs, align="rrrrrr")]
        left = [r for r in tables["conversations"] if r["server_config"] == sc and r["left_out"]]
        lines += [""] if left else []
        for r in left:
            lines.append(
                f"- {axis} {r[axis]}: {r['left_out']} repeat(s) left out (a failed validity "
                "check removes their TTFT)"
            )
        lines.append("")
    return lines
