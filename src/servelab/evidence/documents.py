"""The documents of an evidence bundle, typed: manifest.json (`Manifest`), provenance.json
(`Provenance`) and the blocks inside it, and the attestation's resolved dependencies. Written by
servelab.evidence.bundle; read by servelab.evidence.verify and servelab.evidence.release.

What a bundle copies from a file of its own (runtime.json's facts, the host's facts, the
resolved config, a sequential sweep's rule) keeps that file's open shape: those blocks are
whatever that file holds."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from servelab.documents import JsonObject
from servelab.documents.declared import (
    ConfirmsFacts,
    DatasetFacts,
    ModelFacts,
    ModelJson,
    ProvenanceEndpoint,
    StoppingRuleFacts,
)

# a source endpoint's model: as the server described it (nothing pinned)
SERVED: tuple[Literal["url", "served_model", "model"], ...] = ("url", "served_model", "model")


def model_facts(model: ModelJson) -> ModelFacts:
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


class EndpointPart(TypedDict, total=False):
    """provenance.json's `endpoint`, for a run on a server servelab did not launch."""

    endpoint: ProvenanceEndpoint


class DatasetPart(TypedDict, total=False):
    """provenance.json's `dataset`, for a dataset workload."""

    dataset: DatasetFacts


class TracePart(TypedDict, total=False):
    """provenance.json's `trace`, for a trace replay (servelab.evidence.replay)."""

    trace: JsonObject


class StoppingRulePart(TypedDict, total=False):
    """provenance.json's `stopping_rule`, for a sequential sweep: run.json's rule, with the
    rounds measured and why it stopped."""

    stopping_rule: StoppingRuleFacts


class ConfirmsPart(TypedDict, total=False):
    """provenance.json's `confirms`, for a confirmation experiment."""

    confirms: ConfirmsFacts


class Dependency(TypedDict):
    """An in-toto resolved dependency: a URI and, where pinned, its digest."""

    uri: str
    digest: NotRequired[dict[str, str | None]]
