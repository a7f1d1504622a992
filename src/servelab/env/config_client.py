"""client.cross_check (servelab.measure.crosscheck), checked as the config is validated
(servelab.config calls `check_client` on the resolved config): the tools are given what
servelab's client sends only for plain prompts with one output length, at a rate only from an
arrival process the tool draws, and vllm bench serve runs from a venv runtime. Each refusal
is one line naming the key; client.schedule servelab only for tools that take a schedule."""

from __future__ import annotations

from collections.abc import Sequence

from servelab.documents import JsonObject
from servelab.errors import ServelabError
from servelab.store.jsonio import as_object


def check_client(cfg: JsonObject, source: str) -> None:
    """client.cross_check: the tools take what servelab's client sends only for plain prompts
    with one output length, at a rate only from an arrival process each tool draws, on a
    runtime whose venv holds vllm bench."""
    client = cfg.get("client")
    tools = as_object(client).get("cross_check") if isinstance(client, dict) else None
    if not isinstance(tools, list) or not tools:
        return
    sweep, wl = as_object(cfg["sweep"]), as_object(cfg["workload"])
    why = None
    if sweep.get("rate"):
        why = _arrival_refused(tools, as_object(sweep.get("arrival") or {}))
    if why is None and isinstance(as_object(sweep).get("repeats"), dict):
        why = "sweep.repeats: a sequential plan; give a fixed number of repeats"
    for key in ("dataset", "trace", "shared_prefix", "chat"):
        if why is None and wl.get(key) is not None:
            why = f"workload.{key}: the tools are given plain prompts only; remove it"
    if why is None and isinstance(wl.get("output_tokens"), dict):
        why = "workload.output_tokens: the tools are given one output length; give a number"
    if why is None and as_object(client).get("schedule") == "servelab":
        why = _schedule_refused(tools, bool(sweep.get("rate")))
    if why is None and "vllm" in tools and as_object(cfg["runtime"]).get("kind") != "venv":
        why = "runtime.kind: vllm bench serve runs from a venv runtime's own vLLM"
    if why is not None:
        raise ServelabError(f"{source}: client.cross_check {', '.join(map(str, tools))}: {why}")


# the arrival processes each tool draws (AIPerf --arrival-pattern; GuideLLM's profile kinds;
# vllm bench serve's gamma gaps, Poisson at --burstiness 1)
PROCESSES = {
    "aiperf": ("poisson", "gamma", "constant"),
    "guidellm": ("poisson", "constant"),
    "vllm": ("poisson", "gamma"),
}


def _arrival_refused(tools: Sequence[object], arrival: JsonObject) -> str | None:
    """Why a rate sweep's arrival process cannot be given to one of the tools (None: it can)."""
    process = str(arrival.get("process", "poisson"))
    for tool in tools:
        can = PROCESSES.get(str(tool))
        if can is not None and process not in can:
            return (
                f"sweep.arrival.process {process}: {tool} draws {' or '.join(can)} arrivals "
                f"only; choose one of those or leave {tool} out"
            )
    return None


# the tools that take a schedule of send times from a file (AIPerf's --fixed-schedule)
TAKES_SCHEDULE = ("aiperf",)


def _schedule_refused(tools: Sequence[object], rated: bool) -> str | None:
    """Why client.schedule servelab cannot be given (None: it can): it needs a rate sweep,
    and tools that take a schedule."""
    if not rated:
        return "client.schedule servelab: a schedule is sent at a rate; give sweep.rate"
    others = [str(t) for t in tools if t not in TAKES_SCHEDULE]
    if others:
        return (
            f"client.schedule servelab: {', '.join(others)} take no schedule of send times "
            f"(only {', '.join(TAKES_SCHEDULE)} does); leave them out or set client.schedule own"
        )
    return None
