"""Two runs' servers as they ran: the engine settings each server resolved (launch.json
`engine`, servelab.launch.engine_config), set side by side configuration by configuration.

Every difference is named, with the value on each side: "max_num_batched_tokens 2048 -> 8192".
A difference in a setting that shapes scheduling (engine_config.SCHEDULING) that neither run's
server arguments pinned blocks the comparison of orderings, knees and claims: the two runs
measured different servers. A difference the arguments pinned on both sides is the config's own
change, already compared as such. A side that recorded no settings (a run made before they were
recorded, a server servelab did not launch) says so; it does not fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servelab.documents.declared import EngineDiff, EngineRow
from servelab.launch.engine_config import NOT_RECORDED, PINNED_BY, SCHEDULING, departures
from servelab.store.records import LaunchRecord

Settings = Mapping[str, Mapping[str, Any]]


def launched_configs(root: Path) -> list[str]:
    """The server configurations a run or bundle launched (server/<sc>/launch.json)."""
    return sorted(f.parent.name for f in (root / "server").glob(f"*/{LaunchRecord.FILE}"))


# each configuration's launch.json, by configuration (servelab.analysis.dataset.Dataset.launches
# within an analysis, `launches_of` for a run or bundle read from another)
Launches = Mapping[str, Mapping[str, Any]]


def launches_of(root: Path) -> dict[str, dict[str, Any]]:
    """The launch.json of each configuration a run or bundle launched (server/<sc>/), for the
    comparisons of one run with another (a reproduction, the history, the summary)."""
    out: dict[str, dict[str, Any]] = {}
    for sc in launched_configs(root):
        record = LaunchRecord.read_if_present(root / "server" / sc / LaunchRecord.FILE)
        if record is not None:
            out[sc] = dict(record.doc)
    return out


def engine_of(launches: Launches, sc: str) -> tuple[Settings | None, dict[str, Any]]:
    """A configuration's resolved engine settings (its launch.json `engine`), None where none
    were recorded; and the server arguments it was launched with."""
    doc = launches.get(sc)
    if doc is None:
        return None, {}
    engine = doc.get("engine") or {}
    settings = engine.get("settings") if isinstance(engine, dict) else None
    args = doc.get("args")
    return (settings if isinstance(settings, dict) else None), dict(
        args if isinstance(args, dict) else {}
    )


def _value(settings: Settings, name: str) -> Any:
    entry = settings.get(name)
    return entry.get("value") if isinstance(entry, Mapping) else None


def _row(label: str, setting: str, va: Any, vb: Any, args: tuple[Any, Any]) -> EngineRow:
    """A setting resolved differently on the two sides. `pinned`: the server arguments asked
    for it differently, so the difference is the config's own (a change of arguments, which
    the comparison sees as such); where both asked the same, or neither asked, the servers
    differ where the config does not, and for a scheduling setting that blocks."""
    flag = PINNED_BY.get(setting)
    asked = [a.get(flag) if flag is not None else None for a in args]
    text = f"{setting} {va} -> {vb}"
    pinned = asked[0] != asked[1]
    if pinned:
        text += f" (the server arguments asked {asked[0]} and {asked[1]})"
    elif asked[0] is not None:
        text += f" (both asked {asked[0]}; vLLM resolved otherwise)"
    else:
        text += " (vLLM's own choice on each side: not pinned)"
    return {
        "server_config": label,
        "setting": setting,
        "a": va,
        "b": vb,
        "scheduling": setting in SCHEDULING,
        "pinned": pinned,
        "text": text,
    }


def compare_engines(
    a_launches: Launches,
    b_launches: Launches,
    pairs: list[tuple[str, str]],
    names: tuple[str, str] = ("the reference", "the fresh run"),
) -> EngineDiff:
    """Configuration `pairs` (a's name, b's name) of two runs, setting by setting."""
    rows: list[EngineRow] = []
    blocking: list[str] = []
    missing: list[str] = []
    for sa, sb in pairs:
        (ea, args_a), (eb, args_b) = engine_of(a_launches, sa), engine_of(b_launches, sb)
        label = sa if sa == sb else f"{sa} / {sb}"
        absent = [name for name, e in zip(names, (ea, eb), strict=True) if e is None]
        if absent:
            missing.append(f"{label}: {NOT_RECORDED} in {' or '.join(absent)}")
        if ea is None or eb is None:
            continue
        for setting in sorted(set(ea) | set(eb)):
            va, vb = _value(ea, setting), _value(eb, setting)
            if va == vb:
                continue
            row = _row(label, setting, va, vb, (args_a, args_b))
            rows.append(row)
            if row["scheduling"] and not row["pinned"]:
                blocking.append(f"engine setting of {label}: {row['text']}")
    return {"rows": rows, "blocking": blocking, "not_recorded": missing}


def pair_engine(launches: Launches, a: str, b: str) -> list[str]:
    """What differs between two configurations of one run as their servers resolved them (an
    A/B of runtimes, a rerun's two sides), one text each ('max_num_seqs 256 -> 1024 (vLLM's
    own choice on each side: not pinned)'), and a side that recorded none; empty: none
    differs."""
    diff = compare_engines(launches, launches, [(a, b)], names=(a, b))
    return [r["text"] for r in diff["rows"]] + diff["not_recorded"]


def engine_text(lines: list[str] | None) -> list[str]:
    """A report's words for `pair_engine`'s lines: none where they were not compared (a table
    written before), 'none differs', or each difference."""
    if lines is None:
        return []
    if not lines:
        return ["", "Engine settings, as the two servers resolved them: none differs."]
    return ["", "Engine settings that differ, as the two servers resolved them:", ""] + [
        f"- {line}" for line in lines
    ]


# the settings the summary shows of each server, in this order
SHOWN = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "num_gpu_blocks",
    "kv_cache_dtype",
    "dtype",
    "compilation_mode",
    "attention_backend",
)


def resolved_lines(root: Path) -> list[str]:
    """The summary's engine lines: each configuration's server as it resolved its settings
    (its latest launch), the settings resolved otherwise than its arguments asked, and the
    configurations that recorded none."""
    lines = []
    launches = launches_of(root)
    for sc in launched_configs(root):
        settings, args = engine_of(launches, sc)
        if not settings:
            lines.append(f"  {sc}: {NOT_RECORDED}")
            continue
        shown = [f"{k} {_value(settings, k)}" for k in SHOWN if _value(settings, k) is not None]
        lines.append(f"  {sc}: " + ", ".join(shown))
        lines += [f"  {sc}: resolved otherwise than asked: {d}" for d in departures(settings, args)]
    if not lines:
        return []
    return ["", "engine settings as the servers resolved them (launch.json engine):", *lines]
