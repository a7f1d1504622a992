"""A server servelab did not launch (`runtime.kind: endpoint`): what it says of itself, and the
how servelab measures it.

servelab starts nothing for an endpoint and pins nothing of it. What it records is what the
server at `runtime.url` says: its models (/v1/models: id, root, max_model_len), its version
(/version), its build and configuration info on /metrics (`vllm:cache_config_info`'s labels:
KV cache blocks, block size, prefix caching, ...; `python_info`) and, for a server on this
host, its process (found by the port it listens on). A fact it does not say is recorded as
null, never guessed.

- `parse_url`: runtime.url as a base URL (scheme, host, port; no /v1).
- `probe`: the runtime stage's record (runtime.json); an unreachable URL or a model the server
  does not serve fails in one line naming runtime.url or runtime.served_model.
- `attach_facts`, `capacity_facts`: what a launch records of the server (launch.json's
  `endpoint`, capacity.json).
- `is_local_host`, `listening_pid`, `server_process`: where the telemetry finds the server's
  CPU (a local URL: the process listening on the port and its tree; elsewhere: absent, and why).
The config rules for an endpoint (`check_written`, `derive_model`) are in
servelab.env.endpoint_config.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from servelab.documents.declared import CapacityJson, EndpointFacts, RuntimeJson, ServedModel
from servelab.errors import ServelabError
from servelab.experiment import RuntimeSection

KIND = "endpoint"
# the one server configuration of an endpoint experiment, when server.configs is left out
DEFAULT_CONFIG = "endpoint"
NOT_LAUNCHED = "not launched by servelab"
REMOTE = "remote endpoint: the server's processes are not on this host"
PROBE_TIMEOUT_S = 10.0
# /v1/models fields kept (`created` and `permission` change from one call to the next)
MODEL_FIELDS = ("id", "object", "owned_by", "root", "parent", "max_model_len")


# --- the URL -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EndpointUrl:
    """runtime.url, parsed: `base` is scheme://host:port (the port always written)."""

    base: str
    scheme: str
    host: str
    port: int


def parse_url(url: str, key: str = "runtime.url") -> EndpointUrl:
    """The base URL of a server, or one line naming `key` and what to give."""
    example = "e.g. http://127.0.0.1:8000"
    try:
        p = urllib.parse.urlsplit(str(url).strip())
        port = p.port
    except ValueError:
        raise ServelabError(
            f"{key}: {url!r} is not a URL; give the server's base URL, {example}"
        ) from None
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ServelabError(
            f"{key}: {url!r} is not a base URL: give scheme, host and port, {example}"
        )
    host = p.hostname
    netloc = f"[{host}]" if ":" in host else host
    port = port or (443 if p.scheme == "https" else 80)
    base = f"{p.scheme}://{netloc}:{port}"
    if p.username or p.password or p.query or p.fragment:
        raise ServelabError(
            f"{key}: {url!r} carries credentials, a query or a fragment; give the base URL "
            f"alone, {base}"
        )
    path = p.path.rstrip("/")
    if path:
        why = "servelab adds /v1 itself" if path.endswith("/v1") else "no path"
        raise ServelabError(
            f"{key}: {url!r} has the path {p.path!r} ({why}); give the base URL, {base}"
        )
    return EndpointUrl(base, p.scheme, host, port)


# --- asking the server ------------------------------------------------------------------


def fetch(base: str, path: str, timeout_s: float = PROBE_TIMEOUT_S, body: Any = None) -> bytes:
    """GET (or, with a JSON body, POST) base + path; the answer's bytes. Raises HTTPError for
    an HTTP error status, OSError (URLError, a timeout) when nothing answers."""
    data = json.dumps(body).encode("utf-8") if body is not None else None
    req = urllib.request.Request(
        f"{base}{path}", data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return bytes(resp.read())


def _reason(exc: BaseException) -> str:
    """Why a request failed, in a few words."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    inner = getattr(exc, "reason", None)
    if isinstance(inner, BaseException):
        exc = inner
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(exc, socket.gaierror):
        return "the host name does not resolve"
    text = str(inner if isinstance(inner, str) else exc).strip() or type(exc).__name__
    return text[:120]


def _json_or_none(base: str, path: str, timeout_s: float) -> Any:
    """The JSON an optional endpoint answers; None when it does not (or not with JSON)."""
    try:
        return json.loads(fetch(base, path, timeout_s))
    except (OSError, ValueError):
        return None


class MetricsInfo(TypedDict):
    """What /metrics says of the server itself (`metrics_info`)."""

    info: dict[str, dict[str, str]] | None
    process_start_time_s: float | None


class AttachFacts(TypedDict):
    """What a server servelab did not launch says of itself (`attach_facts`)."""

    url: str
    served_model: str
    launched: bool
    local: bool
    health: int | None
    model: ServedModel
    models: list[str]
    version: dict[str, object] | None
    vllm_version: str | None
    server_info: dict[str, dict[str, str]] | None
    process_start_time_s: float | None


def list_models(base: str, timeout_s: float = PROBE_TIMEOUT_S) -> list[dict[str, object]]:
    """The server's /v1/models entries; one line naming runtime.url when it does not answer
    with a model list."""
    try:
        raw = fetch(base, "/v1/models", timeout_s)
    except urllib.error.HTTPError as exc:
        raise ServelabError(
            f"runtime.url: {base} answers GET /v1/models with {_reason(exc)}, not a model "
            "list; give the base URL of a vLLM (OpenAI-compatible) server that asks for no API "
            "key"
        ) from None
    except OSError as exc:
        raise ServelabError(
            f"runtime.url: nothing answers at {base} (GET /v1/models: {_reason(exc)}); start "
            "the server, or give the base URL it listens on (scheme, host, port; no /v1)"
        ) from None
    try:
        data = json.loads(raw).get("data")
    except (ValueError, AttributeError):
        data = None
    if not isinstance(data, list):
        raise ServelabError(
            f"runtime.url: {base}/v1/models is not an OpenAI model list; give the base URL of "
            "a vLLM (OpenAI-compatible) server"
        )
    return [m for m in data if isinstance(m, dict)]


def served_entry(base: str, served_model: str, models: list[dict[str, object]]) -> ServedModel:
    """The /v1/models entry of `served_model` (its kept fields, as the server gave them: the
    schemas of the records it goes into check them); one line naming runtime.served_model,
    with the names the server serves, when there is none."""
    for m in models:
        if m.get("id") == served_model:
            return cast(ServedModel, {k: m.get(k) for k in MODEL_FIELDS if k in m})
    names = ", ".join(repr(str(m.get("id"))) for m in models) or "no model"
    raise ServelabError(
        f"runtime.served_model: {served_model!r} is not served at {base} (its /v1/models lists "
        f"{names}); give one of those"
    )


_INFO_RE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*_info)\{(?P<labels>.*)\}\s+\S+\s*$")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_START_RE = re.compile(r"^process_start_time_seconds\s+(\S+)\s*$")


def metrics_info(text: str) -> MetricsInfo:
    """What a Prometheus /metrics text says of the server itself: every `*_info` metric's
    labels (vllm:cache_config_info, python_info, ...; the first series of each) and
    process_start_time_seconds."""
    info: dict[str, dict[str, str]] = {}
    start: float | None = None
    for line in text.splitlines():
        m = _INFO_RE.match(line)
        if m and m["name"] not in info:
            labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in
                      _LABEL_RE.findall(m["labels"])}  # fmt: skip
            info[m["name"]] = dict(sorted(labels.items()))
            continue
        s = _START_RE.match(line)
        if s:
            try:
                start = float(s.group(1))
            except ValueError:
                start = None
    return {"info": dict(sorted(info.items())), "process_start_time_s": start}


def attach_facts(base: str, served_model: str, timeout_s: float = PROBE_TIMEOUT_S) -> AttachFacts:
    """What the server at `base` says of itself: its /health status, the served model's
    /v1/models entry (one line naming runtime.url or runtime.served_model when it has none),
    every model it serves, /version, and /metrics' info (null when it has no /metrics)."""
    models = list_models(base, timeout_s)
    entry = served_entry(base, served_model, models)
    try:
        fetch(base, "/health", timeout_s)
        health: int | None = 200
    except urllib.error.HTTPError as exc:
        health = exc.code
    except OSError:
        health = None
    version = _json_or_none(base, "/version", timeout_s)
    try:
        metrics = metrics_info(fetch(base, "/metrics", timeout_s).decode("utf-8", "replace"))
    except OSError:
        metrics = MetricsInfo(info=None, process_start_time_s=None)
    return {
        "url": base,
        "served_model": served_model,
        "launched": False,
        "local": is_local_host(parse_url(base).host),
        "health": health,
        "model": entry,
        "models": sorted(str(m.get("id")) for m in models),
        "version": version if isinstance(version, dict) else None,
        "vllm_version": _version_text(version),
        "server_info": metrics["info"],
        "process_start_time_s": metrics["process_start_time_s"],
    }


def _version_text(version: Any) -> str | None:
    v = version.get("version") if isinstance(version, dict) else None
    return str(v) if v else None


def probe(url: str, served_model: str, timeout_s: float = PROBE_TIMEOUT_S) -> RuntimeJson:
    """The runtime stage for an endpoint: runtime.json's record of the server at `url` serving
    `served_model` (one line naming runtime.url or runtime.served_model when it does not).
    Nothing is pinned: no lock, no image, no package servelab installed (`packages` is empty);
    the Python version is what /metrics' python_info says."""
    facts = attach_facts(parse_url(url).base, served_model, timeout_s)
    python = ((facts["server_info"] or {}).get("python_info") or {}).get("version")
    return {
        "kind": KIND,
        "url": facts["url"],
        "served_model": facts["served_model"],
        "launched": facts["launched"],
        "local": facts["local"],
        "health": facts["health"],
        "model": facts["model"],
        "models": facts["models"],
        "version": facts["version"],
        "vllm_version": facts["vllm_version"],
        "server_info": facts["server_info"],
        "process_start_time_s": facts["process_start_time_s"],
        "lock": None,
        "lock_sha256": None,
        "python_version": python,
        "packages": {},
    }


def ensure_endpoint(runtime: RuntimeSection, say: Callable[[str], None] = print) -> RuntimeJson:
    """The runtime stage for runtime.kind endpoint: probe the server (`probe`) and say what it
    is; the record is runtime.json's."""
    if runtime.url is None or runtime.served_model is None:  # config.validate requires both
        raise ServelabError("runtime.url: runtime.kind endpoint needs runtime.url and served_model")
    record = probe(runtime.url, runtime.served_model)
    model = record["model"]
    where = "on this host" if record["local"] else "on another host"
    say(
        f"runtime: endpoint {record['url']} ({where}, {NOT_LAUNCHED}): serves "
        f"{model.get('id')} (root {model.get('root')}, max_model_len "
        f"{model.get('max_model_len')}), vLLM {record['vllm_version'] or 'version unknown'}"
    )
    return record


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(str(labels.get(key)))
    except ValueError:
        return None


def _label_float(labels: Mapping[str, str], key: str) -> float | None:
    try:
        return float(str(labels.get(key)))
    except ValueError:
        return None


def capacity_facts(facts: EndpointFacts) -> CapacityJson:
    """capacity.json for a server servelab did not launch, from what it said of itself
    (`attach_facts`): the KV cache's tokens and the sequences of max_model_len tokens it fits
    from vllm:cache_config_info, the version from /version; no startup log, so the arguments
    (non_default_args, max_num_seqs) are unknown: null."""
    labels = ((facts["server_info"] or {}).get("vllm:cache_config_info")) or {}
    tokens = _label_int(labels, "kv_cache_size_tokens")
    blocks, size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
    if tokens is None and blocks is not None and size is not None:
        tokens = blocks * size
    conc = _label_float(labels, "kv_cache_max_concurrency")
    model_len = facts["model"].get("max_model_len")
    return {
        "launched": False,
        "url": facts["url"],
        "served_model": facts["served_model"],
        "local": facts["local"],
        "max_model_len": model_len,
        "kv_cache_tokens": tokens,
        "kv_cache_device": None,
        "max_concurrency": conc,
        "max_concurrency_tokens_per_request": model_len if conc is not None else None,
        "non_default_args": None,
        "max_num_seqs": None,
        "version": None,
        "version_endpoint": facts.get("vllm_version"),
        "cache_config": dict(labels) or None,
    }


class EndpointsFacts(TypedDict, total=False):
    """The analysis's `host.endpoints` (`report_facts`): capacity.json of each configuration
    measured on a server servelab did not launch."""

    endpoints: dict[str, dict[str, object]]


def report_facts(capacity: Mapping[str, Mapping[str, object]]) -> EndpointsFacts:
    """The analysis's `host.endpoints`: each configuration measured on a server servelab did
    not launch (capacity.json `launched` false) with what it said of itself; nothing when
    every server was launched (the results of such data stay as they were)."""
    found = {sc: dict(cap) for sc, cap in sorted(capacity.items()) if cap.get("launched") is False}
    return {"endpoints": found} if found else {}


def report_line(cap: Mapping[str, object]) -> str:
    """One configuration's running server, in words, for the report's Host section."""
    local = cap.get("local")
    where = (
        "on this host"
        if local is True
        else "on another host: the host facts are the client's"
        if local is False
        else "host not known"
    )
    return (
        f"the running server at {cap.get('url')}, {NOT_LAUNCHED} ({where}): vLLM "
        f"{cap.get('version_endpoint') or 'version unknown'} serving {cap.get('served_model')} "
        f"(max_model_len {cap.get('max_model_len')}); its arguments, runtime and model files "
        "are not pinned"
    )


def token_ids(
    base: str, served_model: str, text: str, timeout_s: float = PROBE_TIMEOUT_S
) -> list[int]:
    """The server's /tokenize of `text`, without special tokens."""
    body = {"model": served_model, "prompt": text, "add_special_tokens": False}
    try:
        answer = json.loads(fetch(base, "/tokenize", timeout_s, body))
        return [int(t) for t in answer["tokens"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ServelabError(
            f"runtime.url: {base} does not tokenize for {served_model!r} (POST /tokenize: "
            f"{_reason(exc) if isinstance(exc, OSError) else 'no token list'}); servelab builds "
            "prompts of exact lengths with the server's own /tokenize and /detokenize"
        ) from None


# --- where the server runs ----------------------------------------------------------------


def _own_addresses() -> set[str]:
    import psutil

    out: set[str] = set()
    try:
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%", 1)[0] for a in addrs)
    except (OSError, RuntimeError):
        pass
    return out


def is_local_host(host: str, own: set[str] | None = None) -> bool:
    """Whether `host` is this host: a loopback address (127.0.0.0/8, ::1), localhost, or an
    address of one of its interfaces (`own`: those addresses; None: psutil lists them)."""
    name = host.strip("[]").lower()
    if name in ("localhost", "localhost.localdomain"):
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        try:  # a name: the address it resolves to
            addr = ipaddress.ip_address(socket.gethostbyname(name))
        except (OSError, ValueError):
            return False
    if addr.is_loopback:
        return True
    return str(addr) in (_own_addresses() if own is None else own)


def listening_pid(port: int) -> int | None:
    """The process listening on TCP `port` on this host (psutil.net_connections); None when
    none is, or it belongs to a user whose processes this one cannot see."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def server_process(url: str) -> int | str:
    """The root of the server's process tree for the telemetry (a local URL: the process
    listening on its port), or why there is none: REMOTE for a server on another host."""
    where = parse_url(url)
    if not is_local_host(where.host):
        return REMOTE
    pid = listening_pid(where.port)
    if pid is None:
        return (
            f"local endpoint, but no process this user can see listens on port {where.port}: "
            "the server's CPU is not sampled"
        )
    return pid
