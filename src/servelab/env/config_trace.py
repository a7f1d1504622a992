"""A trace workload (`workload.trace`, servelab.workload.trace), checked as the config is
validated (servelab.config calls `check_trace` on the config as written and on the resolved
one). Each refusal is one line naming the key."""

from __future__ import annotations

from servelab.documents import JsonObject
from servelab.errors import ServelabError
from servelab.experiment.workload import scaled_block_tokens
from servelab.store.jsonio import as_object

# workload keys a trace replaces: it gives every request's lengths and its prefix sharing
NOT_WITH_TRACE = ("dataset", "shared_prefix", "chat")
# analysis.validity keys of a trace replay's checks (servelab.analysis.validity.replay)
TRACE_THRESHOLDS = ("min_trace_reuse", "max_trace_missing_pct")


def check_trace_as_written(wu: JsonObject, source: str) -> None:
    """In the config as written: a trace by path has its sha256, and gives the lengths (no
    input_tokens, output_tokens) and the prompts (no dataset, shared prefix or chat)."""
    tr = wu.get("trace")
    if not isinstance(tr, dict):
        return
    if "path" in tr and "sha256" not in tr:
        from pathlib import Path

        from servelab.store.hashing import sha256_file

        found = Path(str(tr["path"]))
        pin = f"sha256: {sha256_file(found)}" if found.is_file() else "its sha256"
        raise ServelabError(
            f"{source}: workload.trace.sha256: required with path: pin {tr['path']} with {pin}"
        )
    if tr.get("busiest") is not None and ("start_s" in tr or "duration_s" in tr):
        raise ServelabError(
            f"{source}: workload.trace.busiest: the window is the busiest {tr['busiest']} s; "
            "remove start_s and duration_s, or busiest"
        )
    for key in ("input_tokens", "output_tokens", *NOT_WITH_TRACE):
        if wu.get(key) is not None:
            raise ServelabError(
                f"{source}: workload.{key}: a trace gives every request's prompt and lengths; "
                f"remove {key} or workload.trace"
            )


def check_trace(cfg: JsonObject, source: str) -> bool:
    """The resolved config: an absent trace is dropped (resolved configs stay as they were);
    a trace needs sweep.rate and unique prompts, and the config then holds no input_tokens
    nor output_tokens. True when there is a trace."""
    validity = as_object(as_object(cfg["analysis"])["validity"])
    for key in TRACE_THRESHOLDS:
        if validity.get(key, 0) is None:
            del validity[key]  # absent unless given: resolved configs stay as they were
    wu = as_object(cfg["workload"])
    if wu.get("trace", 0) is None:
        del wu["trace"]
    found = wu.get("trace")
    if found is None:
        return False
    tr = as_object(found)
    if ("path" in tr) == ("hub" in tr):
        raise ServelabError(
            f"{source}: workload.trace: give path (with its sha256) or hub, "
            + ("not both" if "path" in tr else "e.g. path: datasets/mooncake-sample.jsonl")
        )
    for key in ("duration_s", "busiest", "max_output_tokens"):
        if tr.get(key, 0) is None:
            del tr[key]  # absent unless given
    block, scale = tr["block_tokens"], tr["length_scale"]
    assert isinstance(block, int) and isinstance(scale, int | float)  # the schema's types
    try:
        scaled_block_tokens(block, scale)
    except ServelabError as exc:
        raise ServelabError(f"{source}: {exc}") from None
    if as_object(cfg["sweep"]).get("rate") is None:
        raise ServelabError(
            f"{source}: workload.trace: a trace is replayed on its own schedule, an open loop; "
            "give sweep.rate (each rate a time scale of the trace) instead of sweep.concurrency"
        )
    if not wu["unique_prompts"]:
        raise ServelabError(
            f"{source}: workload.unique_prompts: false does not apply to a trace (each point "
            "replays its own copy, so no point finds another's blocks cached); remove it"
        )
    wu.pop("input_tokens", None)
    wu.pop("output_tokens", None)
    return True
