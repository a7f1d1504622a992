"""client.cross_check (servelab.measure.crosscheck), checked as the config is validated
(servelab.config calls `check_client` on the resolved config): the tools are given what
servelab's client sends only for closed-loop levels of plain prompts with one output length,
and vllm bench serve runs from a venv runtime. Each refusal is one line naming the key."""

from __future__ import annotations

from servelab.documents import JsonObject
from servelab.errors import ServelabError
from servelab.store.jsonio import as_object


def check_client(cfg: JsonObject, source: str) -> None:
    """client.cross_check: the tools take what servelab's client sends only for closed-loop
    levels of plain prompts with one output length, on a runtime whose venv holds vllm bench."""
    client = cfg.get("client")
    tools = as_object(client).get("cross_check") if isinstance(client, dict) else None
    if not isinstance(tools, list) or not tools:
        return
    sweep, wl = as_object(cfg["sweep"]), as_object(cfg["workload"])
    why = None
    if sweep.get("rate"):
        why = "sweep.rate: the tools measure closed-loop levels (sweep.concurrency) only"
    elif isinstance(as_object(sweep).get("repeats"), dict):
        why = "sweep.repeats: a sequential plan; give a fixed number of repeats"
    for key in ("dataset", "trace", "shared_prefix", "chat"):
        if why is None and wl.get(key) is not None:
            why = f"workload.{key}: the tools are given plain prompts only; remove it"
    if why is None and isinstance(wl.get("output_tokens"), dict):
        why = "workload.output_tokens: the tools are given one output length; give a number"
    if why is None and "vllm" in tools and as_object(cfg["runtime"]).get("kind") != "venv":
        why = "runtime.kind: vllm bench serve runs from a venv runtime's own vLLM"
    if why is not None:
        raise ServelabError(f"{source}: client.cross_check {', '.join(map(str, tools))}: {why}")
