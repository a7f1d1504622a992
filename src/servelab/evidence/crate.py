"""The bundle's descriptions for other tools (docs/bundle.md): ro-crate-metadata.json, a
Workflow Run Crate of the workflow and one action per stage, and attestation.intoto.json, an
in-toto statement of the bundle's files with the runtime and model it resolved. Both are
written from provenance.json's facts by `build_bundle` (servelab.evidence.bundle)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.documents.declared import ModelFacts, Provenance
from servelab.env.endpoint import KIND as ENDPOINT, NOT_LAUNCHED
from servelab.evidence.documents import Dependency
from servelab.evidence.files import walk_files
from servelab.store.hashing import sha256_file
from servelab.store.jsonio import write_json

if TYPE_CHECKING:
    from rocrate.model.contextentity import ContextEntity
    from rocrate.model.file import File
    from rocrate.rocrate import ROCrate

UNLISTED = {"manifest.json", "SHA256SUMS"}  # they describe the others


def write_ro_crate(
    out: Path, experiment: str, prov: Provenance, runtime: Mapping[str, object]
) -> None:
    """A Workflow Run Crate: the workflow, one CreateAction per stage, inputs and outputs."""
    from rocrate.rocrate import ROCrate

    crate = ROCrate(gen_preview=False)
    crate.root_dataset["name"] = f"servelab evidence bundle: {experiment}"
    crate.root_dataset["datePublished"] = prov["finished"] or "1970-01-01T00:00:00Z"
    crate.root_dataset["conformsTo"] = [
        {"@id": "https://w3id.org/ro/wfrun/process/0.5"},
        {"@id": "https://w3id.org/ro/wfrun/workflow/0.5"},
    ]
    workflow, server_sw = _crate_software(crate, out, prov, runtime)
    _crate_actions(crate, out, prov, workflow, server_sw)
    crate.metadata.write(out)
    # rocrate writes indented JSON; re-serialize with sorted keys for stable bytes
    meta = json.loads((out / "ro-crate-metadata.json").read_text(encoding="utf-8"))
    meta["@graph"].sort(key=lambda e: str(e.get("@id")))
    (out / "ro-crate-metadata.json").write_text(
        json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def _crate_software(
    crate: ROCrate, out: Path, prov: Provenance, runtime: Mapping[str, object]
) -> tuple[File, ContextEntity]:
    """The crate's workflow (the Snakefile, in Snakemake, its main entity) and the server
    software (vLLM in its runtime)."""
    from rocrate.model.contextentity import ContextEntity

    snakemake_lang = crate.add(
        ContextEntity(
            crate,
            "#snakemake",
            properties={
                "@type": "ComputerLanguage",
                "name": "Snakemake",
                "url": "https://snakemake.github.io",
                "version": prov["pipeline"]["snakemake_version"],
            },
        )
    )
    workflow = crate.add_file(
        out / "workflow" / "Snakefile",
        "workflow/Snakefile",
        properties={
            "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow"],
            "name": "servelab workflow",
            "programmingLanguage": {"@id": snakemake_lang.id},
        },
    )
    crate.root_dataset["mainEntity"] = {"@id": workflow.id}
    server_sw = crate.add(
        ContextEntity(
            crate,
            "#vllm",
            properties={
                "@type": "SoftwareApplication",
                "name": "vLLM",
                "softwareVersion": prov["vllm_version"],
                "description": _runtime_description(runtime),
            },
        )
    )
    return workflow, server_sw


def _crate_files(crate: ROCrate, out: Path, prefix: str) -> list[File]:
    """The files under `prefix` of the bundle `out`, added to the crate."""
    out_files = []
    for rel in walk_files(out / prefix) if (out / prefix).is_dir() else []:
        path = f"{prefix}/{rel}"
        if path.endswith((".json", ".gz", ".csv", ".svg", ".png", ".log", ".md", ".jsonl")):
            out_files.append(crate.add_file(out / path, path))
    return out_files


def _crate_actions(
    crate: ROCrate, out: Path, prov: Provenance, workflow: File, server_sw: ContextEntity
) -> None:
    """One CreateAction per stage: model, runtime, a sweep per server configuration, the
    analysis; each with what it used and what it made."""
    model_files = _crate_files(crate, out, "model")
    runtime_files = _crate_files(crate, out, "runtime")
    crate.add_action(
        workflow,
        identifier="#stage-model",
        result=model_files,
        properties={"name": "model: materialize the model"},
    )
    crate.add_action(
        workflow,
        identifier="#stage-runtime",
        result=runtime_files,
        properties={"name": "runtime: create the server environment"},
    )
    for sc in sorted(p.name for p in (out / "raw").iterdir() if p.is_dir()):
        crate.add_action(
            workflow,
            identifier=f"#stage-sweep-{sc}",
            object=model_files + runtime_files,
            result=_crate_files(crate, out, f"raw/{sc}") + _crate_files(crate, out, f"server/{sc}"),
            properties={
                "name": f"sweep: server configuration {sc}",
                "startTime": prov["started"],
                "endTime": prov["finished"],
                "instrument": [{"@id": workflow.id}, {"@id": server_sw.id}],
            },
        )
    tables = _crate_files(crate, out, "tables") + _crate_files(crate, out, "figures")
    report = crate.add_file(out / "report.md", "report.md")
    crate.add_action(
        workflow,
        identifier="#stage-analysis",
        object=[],
        result=tables + [report],
        properties={"name": "analysis: tables, figures, report"},
    )


def _runtime_description(runtime: Mapping[str, object]) -> str:
    if runtime.get("kind") == ENDPOINT:
        return f"runtime: the server at {runtime.get('url')}, {NOT_LAUNCHED}"
    if runtime.get("kind") == "container":
        pin = runtime.get("image_digest") or f"sha256 {runtime.get('image_sha256')}"
        return f"runtime: {runtime.get('engine')} image {runtime.get('image_ref')} ({pin})"
    return f"runtime: {runtime.get('kind')} from lock sha256 {runtime.get('lock_sha256')}"


def _runtime_dependency(rt: Mapping[str, object]) -> Dependency:
    """The runtime as an in-toto resolved dependency: the lock, or the image by digest; a
    server servelab did not launch by its URL alone (no digest: nothing pinned)."""
    if rt.get("kind") == ENDPOINT:
        return {"uri": f"servelab-endpoint:{rt.get('url')}"}
    if rt.get("kind") == "container":
        digest = str(rt.get("image_digest") or "").removeprefix("sha256:")
        return {
            "uri": f"servelab-runtime-image:{rt.get('image_ref')}",
            "digest": {"sha256": digest or _text(rt.get("image_sha256"))},
        }
    return {
        "uri": f"servelab-runtime-lock:{rt['lock']}",
        "digest": {"sha256": _text(rt["lock_sha256"])},
    }


def _text(value: object) -> str | None:
    """A runtime record's sha256 (a string; None where it records none)."""
    return value if isinstance(value, str) else None


def _model_dependency(model: ModelFacts) -> Dependency:
    """The model as an in-toto resolved dependency: by its revision (a tiny model's sha256, a
    hub commit); a running server's model by name alone (not pinned)."""
    revision = model["revision"]
    if revision is None:
        return {"uri": f"servelab-model:{model['source']}:{model.get('served_model')}"}
    return {
        "uri": f"servelab-model:{model['source']}",
        "digest": {"sha256": revision} if len(revision) == 64 else {"gitCommit": revision},
    }


def write_attestation(out: Path, prov: Provenance) -> None:
    subjects = [
        {"name": rel, "digest": {"sha256": sha256_file(out / rel)}}
        for rel in walk_files(out)
        if rel not in UNLISTED and rel != "attestation.intoto.json"
    ]
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subjects,
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://servelab.dev/buildtypes/experiment/v1",
                "externalParameters": {"experiment": prov["experiment"], "config": prov["config"]},
                "internalParameters": {"servelab_version": prov["pipeline"]["servelab_version"]},
                "resolvedDependencies": [
                    _model_dependency(prov["model"]),
                    _runtime_dependency(prov["runtime"]),
                ]
                + (
                    [
                        {
                            "uri": "git+servelab",
                            "digest": {"gitCommit": prov["pipeline"]["git_commit"]},
                        }
                    ]
                    if prov["pipeline"]["git_commit"]
                    else []
                ),
            },
            "runDetails": {
                "builder": {
                    "id": f"https://servelab.dev/servelab@{prov['pipeline']['servelab_version']}"
                },
                "metadata": {
                    "invocationId": prov["experiment"],
                    "startedOn": prov["started"],
                    "finishedOn": prov["finished"],
                },
            },
        },
    }
    write_json(out / "attestation.intoto.json", statement)
