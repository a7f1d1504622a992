"""The documents of an evidence bundle, typed: manifest.json (`Manifest`), provenance.json
(`Provenance`) and the blocks inside it, and the attestation's resolved dependencies. Written by
servelab.evidence.bundle; read by servelab.evidence.verify and servelab.evidence.release.

What a bundle copies from a file of its own (runtime.json's facts, the host's facts, the
resolved config, a sequential sweep's rule) keeps that file's open shape: those blocks are
whatever that file holds."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from servelab.design.stopping import RuleJson
from servelab.documents import JsonObject, JsonValue
from servelab.evidence.provenance import ConfigRuntimesPart, HostSpeedPart, PipelineFacts
from servelab.experiment import NotTriedJson
from servelab.hostfacts.host import HostFacts


class ManifestEntry(TypedDict):
    """One file of the bundle as manifest.json lists it."""

    path: str
    bytes: int
    sha256: str
    role: str
    schema: str | None


class Manifest(TypedDict):
    """manifest.json: every file of the bundle (less SHA256SUMS and itself)."""

    format_version: int
    experiment: str
    files: list[ManifestEntry]


class ModelFacts(TypedDict):
    """provenance.json `model`: where the model came from and its pin; a source endpoint's
    served model as the server described it (`url`, `served_model`, `model`)."""

    source: str
    repo: str | None
    revision: str | None
    files: dict[str, str]
    url: NotRequired[str]
    served_model: NotRequired[str]
    model: NotRequired[JsonObject]


class ModelRecordFacts(TypedDict):
    """What `model_facts` reads of the model record (model.json, model.schema.json): its
    source, repo, revision and files' sha256 by path; a source endpoint's url, served model and
    the server's /v1/models entry (`model`)."""

    source: str
    repo: NotRequired[str | None]
    revision: str | None
    files: dict[str, str]
    url: NotRequired[str]
    served_model: NotRequired[str]
    model: NotRequired[JsonObject]


# a source endpoint's model: as the server described it (nothing pinned)
SERVED: tuple[Literal["url", "served_model", "model"], ...] = ("url", "served_model", "model")


def model_facts(model: ModelRecordFacts) -> ModelFacts:
    """provenance.json `model` from the model record (model.json)."""
    facts: ModelFacts = {
        "source": model["source"],
        "repo": model.get("repo"),
        "revision": model["revision"],
        "files": model["files"],
    }
    for k in SERVED:
        if k in model:
            facts[k] = model[k]
    return facts


class ServerFacts(TypedDict):
    """provenance.json `servers[sc]`: a configuration's launch and what its server resolved;
    every field None where the bundle holds no launch.json or capacity.json for it."""

    launched: bool | None
    command: list[str] | None
    env: dict[str, str] | None
    args: list[str] | None
    resolved_args: JsonObject | None
    vllm_version: str | None


class EndpointFacts(TypedDict):
    """provenance.json `endpoint`: a server servelab did not launch."""

    url: str | None
    served_model: str | None
    launched: bool
    note: str


class DatasetFacts(TypedDict):
    """provenance.json `dataset`: the dataset file and what each configuration sampled from
    it (raw/<sc>/dataset.json less the file)."""

    file: JsonValue
    samples: dict[str, JsonObject]


class ConfirmedChange(TypedDict):
    """A change a confirmation measures (ConfirmsFacts.changes)."""

    id: str
    diagnoses: list[str]
    server_config: str
    config: str
    change: dict[str, str | int | float | bool]


class ConfirmsFacts(TypedDict):
    """provenance.json `confirms`: the diagnosing experiment, its bundle and the proposals."""

    experiment: str
    bundle: str
    manifest_sha256: str
    changes: list[ConfirmedChange]
    not_tried: list[NotTriedJson]


class EndpointPart(TypedDict, total=False):
    """provenance.json's `endpoint`, for a run on a server servelab did not launch."""

    endpoint: EndpointFacts


class DatasetPart(TypedDict, total=False):
    """provenance.json's `dataset`, for a dataset workload."""

    dataset: DatasetFacts


class TracePart(TypedDict, total=False):
    """provenance.json's `trace`, for a trace replay (servelab.evidence.replay)."""

    trace: JsonObject


class StoppingRuleFacts(RuleJson):
    """provenance.json `stopping_rule`: run.json's rule, the rounds measured and why it stopped
    (run.json `sequential`)."""

    rounds: int
    stopped: str


class StoppingRulePart(TypedDict, total=False):
    """provenance.json's `stopping_rule`, for a sequential sweep: run.json's rule, with the
    rounds measured and why it stopped."""

    stopping_rule: StoppingRuleFacts


class ConfirmsPart(TypedDict, total=False):
    """provenance.json's `confirms`, for a confirmation experiment."""

    confirms: ConfirmsFacts


class Provenance(
    EndpointPart,
    DatasetPart,
    TracePart,
    StoppingRulePart,
    HostSpeedPart,
    ConfirmsPart,
    ConfigRuntimesPart,
):
    """provenance.json: the model, the runtime (runtime.json's RUNTIME_KEYS), the servers, the
    host, the pipeline, the optional parts, the config and when the measurement ran."""

    format_version: int
    experiment: str
    model: ModelFacts
    runtime: dict[str, Any]
    vllm_version: str | None
    servers: dict[str, ServerFacts]
    host: HostFacts | dict[str, Any]
    pipeline: PipelineFacts
    config: dict[str, Any]
    started_epoch_ns: int | None
    finished_epoch_ns: int | None
    started: str | None
    finished: str | None


class Dependency(TypedDict):
    """An in-toto resolved dependency: a URI and, where pinned, its digest."""

    uri: str
    digest: NotRequired[dict[str, str | None]]
