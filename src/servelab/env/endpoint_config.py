"""The config as written for a server servelab did not launch (`runtime.kind: endpoint`):
`check_written` refuses, in one line naming the key, what only a launched server takes (server
arguments, launch settings, a second configuration, a model to build, a profiling pass), and
`derive_model` makes its model the server's (servelab.config calls both; the defaults that
differ for an endpoint are the schema's, `x-endpoint-default`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from servelab.documents import JsonObject, JsonValue
from servelab.env.endpoint import DEFAULT_CONFIG, KIND, parse_url
from servelab.errors import ServelabError

# runtime keys an endpoint takes; every other one configures a server servelab launches
RUNTIME_KEYS = ("kind", "url", "served_model", "device", "cache_dir")
# server keys that configure a launch
LAUNCH_KEYS = ("host", "port", "startup_timeout_s", "shutdown_timeout_s", "engine_nice")
_ABSENT = object()


@dataclass(frozen=True)
class Written:
    """A config section as written, against its defaults: a key counts as given when it is
    present with a value other than its default (a resolved config, whose defaults are filled
    in, is checked as the config it was resolved from)."""

    name: str
    data: Mapping[str, JsonValue]
    defaults: Mapping[str, JsonValue]

    def given(self, key: str) -> bool:
        return key in self.data and self.data[key] != self.defaults.get(key, _ABSENT)

    def keys(self) -> list[str]:
        return [k for k in self.data if self.given(k)]


def _section(
    config: Mapping[str, JsonValue], key: str, defaults: Mapping[str, Mapping[str, JsonValue]]
) -> Written:
    value = config.get(key)
    data = value if isinstance(value, Mapping) else {}
    return Written(key, data, defaults.get(key) or {})


def _check_runtime_written(rt: Written, source: str) -> None:
    for key in rt.keys():
        if key not in RUNTIME_KEYS:
            raise ServelabError(
                f"{source}: runtime.{key}: servelab does not launch the server of runtime.kind "
                f"endpoint, so it has no {key}; remove it (keys: {', '.join(RUNTIME_KEYS)})"
            )
    url = rt.data.get("url")
    if not url or not isinstance(url, str):
        raise ServelabError(
            f"{source}: runtime.url: runtime.kind endpoint measures a running server: give its "
            "base URL as a string, e.g. http://127.0.0.1:8000"
        )
    try:
        parse_url(url)
    except ServelabError as exc:
        raise ServelabError(f"{source}: {exc}") from None
    served = rt.data.get("served_model")
    if not served or not isinstance(served, str):
        raise ServelabError(
            f"{source}: runtime.served_model: give the model name the server serves, as its "
            f"/v1/models lists it (curl {url.rstrip('/')}/v1/models)"
        )


def _check_server_written(server: Written, source: str) -> None:
    why = "servelab did not launch the server at runtime.url and cannot set its arguments"
    if server.given("args") and server.data["args"]:
        raise ServelabError(
            f"{source}: server.args: {why}; remove server.args (start the server with them)"
        )
    for key in LAUNCH_KEYS:
        if server.given(key):
            raise ServelabError(
                f"{source}: server.{key}: configures a server launch, and servelab launches "
                "none for runtime.kind endpoint (runtime.url says where the server is); remove it"
            )
    configs = server.data.get("configs")
    if configs is None:
        return
    if not isinstance(configs, list) or len(configs) != 1:
        n = len(configs) if isinstance(configs, list) else "no list of"
        raise ServelabError(
            f"{source}: server.configs: runtime.kind endpoint measures one server as it runs, "
            f"{n} configurations given; give exactly one, e.g. [{{name: {DEFAULT_CONFIG}}}], "
            "or leave server.configs out"
        )
    if isinstance(configs[0], Mapping) and configs[0].get("args"):
        raise ServelabError(
            f"{source}: server.configs[0].args: {why}; remove them (start the server with them)"
        )


# model keys an endpoint config may carry over from a launched one's (the tiny model's shape,
# its source): unused, since the server serves its own model
MODEL_IGNORED = ("tiny",)


def _check_model_written(model: Written, served: JsonValue, source: str) -> None:
    for key in model.keys():
        if key == "source" and model.data[key] in (KIND, "tiny"):
            continue
        if key == "served_name" and model.data[key] == served:
            continue
        if key in MODEL_IGNORED:
            continue
        raise ServelabError(
            f"{source}: model.{key}: the server at runtime.url serves a model of its own, "
            f"which servelab neither builds nor downloads; remove model.{key} "
            "(runtime.served_model names the model)"
        )


def check_written(
    config: JsonValue,
    source: str,
    defaults: Mapping[str, Mapping[str, JsonValue]] | None = None,
) -> None:
    """The config as written (a key at its default, as `defaults` gives them per section,
    counts as not written: a resolved config passes as the config it was resolved from): for
    runtime.kind endpoint, runtime.url and runtime.served_model given and no runtime key of a
    launched server; no server arguments, launch setting or second configuration; no hub
    model nor another model.served_name than runtime.served_model (a tiny model's section,
    carried over from a launched config, is left unused) and no profiling pass. For another
    kind: neither runtime.url nor runtime.served_model, and no model.source endpoint. One line
    naming the key."""
    if not isinstance(config, Mapping):
        return
    defaults = defaults or {}
    rt = _section(config, "runtime", defaults)
    model = _section(config, "model", defaults)
    if rt.data.get("kind") != KIND:
        for key in ("url", "served_model"):
            if rt.data.get(key) is not None:
                raise ServelabError(
                    f"{source}: runtime.{key}: only for runtime.kind endpoint (a server "
                    "servelab did not launch); remove it, or set runtime.kind: endpoint"
                )
        if model.data.get("source") == KIND:
            raise ServelabError(
                f"{source}: model.source: endpoint goes with runtime.kind endpoint; set "
                "runtime.kind: endpoint (with runtime.url), or another model.source"
            )
        return
    _check_runtime_written(rt, source)
    _check_server_written(_section(config, "server", defaults), source)
    _check_model_written(model, rt.data.get("served_model"), source)
    if _section(config, "profile", defaults).data.get("enabled") is True:
        raise ServelabError(
            f"{source}: profile.enabled: the profiling pass starts the server with a profiler, "
            "which servelab cannot do to a server it did not launch; set profile.enabled: false "
            "or leave it out"
        )


def is_endpoint(config: JsonValue) -> bool:
    """Whether a config (as written) measures a server servelab did not launch."""
    rt = config.get("runtime") if isinstance(config, dict) else None
    return isinstance(rt, dict) and rt.get("kind") == KIND


def derive_model(config: JsonObject) -> None:
    """An endpoint config's model is the server's (in place): model.source endpoint and
    model.served_name runtime.served_model. Its defaults that differ from a launched server's
    (one configuration named `endpoint`, no profiling pass, no environment, compile cache or
    priority for a server servelab does not start) are the schema's, `x-endpoint-default`
    (servelab.config.ENDPOINT_DEFAULT)."""
    rt = config.get("runtime")
    if not isinstance(rt, dict) or rt.get("kind") != KIND:  # not is_endpoint(config)
        return
    model = config.setdefault("model", {})
    if isinstance(model, dict):
        model["source"] = KIND
        model["served_name"] = rt.get("served_model")
