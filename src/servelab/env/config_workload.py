"""The load a config asks for (workload and sweep), checked as the config is validated
(servelab.config calls the `check_*_as_written` checks on the config as written, the others on
the resolved config): lengths that fit the server's context and ranges that are not upside
down, a dataset or a chat where each applies, one sweep axis, rates to the thousandth, and
burstiness for gamma arrivals only. Each refusal is one line naming the key."""

from __future__ import annotations

from pathlib import Path

from servelab.documents import JsonObject, JsonValue
from servelab.env.config_trace import check_trace, check_trace_as_written
from servelab.errors import ServelabError
from servelab.experiment import Lengths, section_from_dict
from servelab.store.jsonio import as_list, as_object


def number(value: JsonValue) -> float:
    """A number of a config the schema has validated; TypeError where it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return value


def _largest(lengths: JsonValue, where: str) -> int:
    """The longest length workload.input_tokens / output_tokens can draw."""
    if isinstance(lengths, int):
        return lengths
    return section_from_dict(Lengths, as_object(lengths), where).largest


def check_workload(cfg: JsonObject, source: str) -> None:
    """Lengths a request may ask fit the server's max-model-len (a chat's last turn carries
    every earlier one), and a {min, max} range is not upside down. With a dataset, which gives
    the lengths, the resolved config holds no input_tokens nor output_tokens (the schema's
    defaults are dropped)."""
    wu = as_object(cfg["workload"])
    for key in ("dataset", "shared_prefix", "chat"):
        if wu.get(key, 0) is None:
            del wu[key]  # absent, as before these keys existed
    if check_trace(cfg, source):
        return  # a trace's requests are filtered to fit (servelab.workload.trace)
    ds = wu.get("dataset")
    if ds is not None:
        ds = as_object(ds)
        if ("path" in ds) == ("hub" in ds):
            raise ServelabError(
                f"{source}: workload.dataset: give path (with its sha256) or hub, "
                + ("not both" if "path" in ds else "e.g. path: datasets/sharegpt-sample.json")
            )
        wu.pop("input_tokens", None)
        wu.pop("output_tokens", None)
        return  # a dataset's pairs are filtered to fit (servelab.workload.datasets)
    for key in ("input_tokens", "output_tokens"):
        v = wu[key]
        if isinstance(v, dict) and "min" in v and "values" in v:
            raise ServelabError(
                f"{source}: workload.{key}: give min and max (a uniform draw) or values, not both"
            )
        if isinstance(v, dict) and "min" in v and number(v["max"]) < number(v["min"]):
            raise ServelabError(
                f"{source}: workload.{key}: max ({v['max']}) is below min ({v['min']}); "
                "give max >= min"
            )
    model_len = as_object(as_object(cfg["server"])["args"]).get("max-model-len")
    if not isinstance(model_len, int):
        return
    chat, shared = wu.get("chat"), wu.get("shared_prefix")
    turns = int(number(as_object(chat)["turns"])) if chat else 1
    prefix = int(number(as_object(shared)["prefix_tokens"])) if shared else 0
    longest = _largest(wu["input_tokens"], "workload.input_tokens") + _largest(
        wu["output_tokens"], "workload.output_tokens"
    )
    need = prefix + turns * longest
    if need > model_len:
        what = "input_tokens + output_tokens"
        if prefix:
            what = "shared_prefix.prefix_tokens + " + what
        if turns > 1:
            what += f" over {turns} chat turns"
        raise ServelabError(
            f"{source}: workload: {what} (longest) = {need} exceeds server.args.max-model-len "
            f"{model_len}; shorten them or raise max-model-len"
        )


def check_workload_as_written(config: object, source: str) -> None:
    """In the config as written: a dataset gives the prompts (no input_tokens), and a chat
    is synthetic."""
    wu = config.get("workload") if isinstance(config, dict) else None
    if not isinstance(wu, dict):
        return
    check_trace_as_written(wu, source)
    for key in ("input_tokens", "output_tokens"):
        v = wu.get(key)
        if isinstance(v, dict) and not ({"min", "max"} <= v.keys() or "values" in v):
            raise ServelabError(
                f"{source}: workload.{key}: give a number, {{min: A, max: B}} (uniform) or "
                f"{{values: [..]}}; got {v!r}"
            )
    ds = wu.get("dataset")
    if isinstance(ds, dict) and "path" in ds and "sha256" not in ds:
        from servelab.store.hashing import sha256_file

        found = Path(str(ds["path"]))
        pin = f"sha256: {sha256_file(found)}" if found.is_file() else "its sha256"
        raise ServelabError(
            f"{source}: workload.dataset.sha256: required with path: pin {ds['path']} with {pin}"
        )
    if ds is None:
        return
    for key in ("input_tokens", "output_tokens"):
        if key in wu:
            raise ServelabError(
                f"{source}: workload.{key}: the lengths come from workload.dataset; remove "
                f"{key} (bound them with workload.dataset.filter; fix every output length "
                "with workload.dataset.output_tokens)"
            )
    if wu.get("chat") is not None:
        raise ServelabError(
            f"{source}: workload.chat: conversations are built from synthetic turns only; "
            "remove workload.dataset or workload.chat"
        )


def check_sweep_axis(config: object, source: str) -> None:
    """In the config as written: sweep.concurrency or sweep.rate, not both; sweep.arrival
    with rates only."""
    sweep = config.get("sweep") if isinstance(config, dict) else None
    if not isinstance(sweep, dict):
        return  # the schema says what is missing
    has_c, has_r = sweep.get("concurrency") is not None, sweep.get("rate") is not None
    if has_c == has_r:
        raise ServelabError(
            f"{source}: sweep: give either concurrency (a closed loop) or rate (an open loop at "
            "requests per second), " + ("not both" if has_c else "e.g. concurrency: [1, 4, 16]")
        )
    if has_c:
        for key in ("rate", "arrival"):
            if key in sweep:
                raise ServelabError(
                    f"{source}: sweep.{key}: applies to a sweep over sweep.rate only; remove it, "
                    "or replace sweep.concurrency with sweep.rate"
                )


def check_rates(sweep: JsonObject, source: str) -> None:
    """A sweep over rates: rates to the thousandth, burstiness for gamma only. A sweep over
    concurrency holds no arrival section (the schema's default is dropped: its resolved
    config stays as it was before rates existed)."""
    if sweep.get("rate") is None:
        sweep.pop("arrival", None)
        return
    for i, r in enumerate(as_list(sweep["rate"])):
        if round(number(r), 3) != number(r):
            raise ServelabError(
                f"{source}: sweep.rate[{i}]: {r!r} has more than three decimals; round it "
                "(points are named by rate to the thousandth)"
            )
    check_arrival(as_object(sweep["arrival"]), "sweep.arrival", source)


def check_arrival(arrival: JsonObject, where: str, source: str) -> None:
    """An arrival section (sweep.arrival, search.arrival): burstiness for gamma only."""
    if arrival["process"] != "gamma" and number(arrival["burstiness"]) != 1:
        raise ServelabError(
            f"{source}: {where}.burstiness: {arrival['burstiness']!r} applies to "
            f"process gamma only; set process: gamma, or remove burstiness for "
            f"{arrival['process']}"
        )
