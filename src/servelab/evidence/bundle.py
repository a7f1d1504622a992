"""Build the evidence bundle of one experiment (docs/bundle.md)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from servelab.errors import ServelabError
from servelab.evidence.files import sha256sums_text, walk_files
from servelab.evidence.provenance import host_facts, pipeline_facts, redacted_config
from servelab.evidence.schemas import FOREIGN, check_all_json, schema_for, schema_id
from servelab.experiment import Experiment
from servelab.hashing import sha256_file
from servelab.jsonio import read_json, write_json
from servelab.paths import ANALYSIS_REPORT, ExperimentPaths

FORMAT_VERSION = 1
# runtime.json keys carried into provenance.json: the first five always (venv), the others when
# present (containers: the engine, the image and the digest actually run, vLLM in it; isa: the
# CPU instruction set PyTorch and oneDNN use in the runtime)
RUNTIME_KEYS = (
    "kind",
    "lock",
    "lock_sha256",
    "python_version",
    "packages",
    "engine",
    "engine_version",
    "image",
    "image_ref",
    "image_digest",
    "image_sha256",
    "vllm_version",
    "nsys_version",
    "isa",
)
UNLISTED = {"manifest.json", "SHA256SUMS"}  # they describe the others
WORKFLOW_FILES = [
    "Snakefile",
    "rules/*.smk",
    "scripts/*.py",
    "config/schema/*.yaml",
    "profiles/default/config.yaml",
]


def bundle_path(analysis_rel: str) -> str:
    """Where a file of the analysis folder lives in the bundle."""
    if analysis_rel == "report.md" or analysis_rel.startswith("figures/"):
        return analysis_rel
    return f"tables/{analysis_rel}"


def role_of(path: str) -> str:
    if path.startswith("raw/"):
        if "/warmup/" in path:
            return "warmup"
        if ".incomplete" in path:
            return "raw-incomplete"
        return "raw"
    first = path.split("/", 1)[0]
    return {
        "server": "server",
        "tables": "table",
        "figures": "figure",
        "workflow": "workflow",
        "model": "model",
        "runtime": "runtime",
        "telemetry": "telemetry",
        "profile": "profile",
        "report.md": "report",
        "provenance.json": "provenance",
        "config.resolved.yaml": "config",
        "ro-crate-metadata.json": "ro-crate",
        "attestation.intoto.json": "attestation",
    }.get(first, "other")


def _iso(epoch_ns: int | None) -> str | None:
    if epoch_ns is None:
        return None
    return dt.datetime.fromtimestamp(epoch_ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _copy_tree(src: Path, dest: Path, skip_suffixes: tuple[str, ...] = ()) -> None:
    for rel in walk_files(src):
        if rel.endswith(skip_suffixes):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)


def _run_window(paths: ExperimentPaths) -> tuple[int | None, int | None]:
    starts, ends = [], []
    for pj in sorted(paths.raw.glob("*/rep*/c*/point.json")) + sorted(
        paths.raw.glob("*/warmup/point.json")
    ):
        p = read_json(pj)
        starts.append(p.get("started_epoch_ns"))
        ends.append(p.get("finished_epoch_ns"))
    for lj in sorted((paths.root / "server").glob("*/launch.json")):
        starts.append(read_json(lj).get("started_epoch_ns"))
    s = [x for x in starts if isinstance(x, int)]
    e = [x for x in ends if isinstance(x, int)]
    return (min(s) if s else None, max(e) if e else None)


def build_bundle(
    exp: Experiment,
    paths: ExperimentPaths,
    out: Path,
    repo: Path,
    *,
    leave_out: Collection[str] = (),
    host: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble, describe and validate the bundle of the experiment in `paths` into `out`
    (replaced if present). `repo`: the checkout whose workflow files are copied. The resolved
    config is recorded without the top-level keys in `leave_out` (the workflow leaves out
    those its bundle rule does not see). `host`: the host facts to record (None: this host's,
    the normal case)."""
    analysis_dir = paths.analysis
    model_record = paths.model / "servelab-model.json"
    runtime_record = paths.runtime / "runtime.json"
    for need in (paths.raw, analysis_dir / ANALYSIS_REPORT, model_record, runtime_record):
        if not need.exists():
            raise ServelabError(f"{need}: missing; run the workflow up to the analysis first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _copy_tree(paths.raw, out / "raw", skip_suffixes=(".tmp",))
    for sc_dir in sorted((paths.root / "server").iterdir()):
        for name in ("server.log", "launch.json", "capacity.json"):
            if (sc_dir / name).exists():
                (out / "server" / sc_dir.name).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(sc_dir / name, out / "server" / sc_dir.name / name)
    (out / "model").mkdir()
    shutil.copyfile(model_record, out / "model" / model_record.name)
    (out / "runtime").mkdir()
    shutil.copyfile(runtime_record, out / "runtime" / runtime_record.name)
    for rel in walk_files(analysis_dir):
        dest = out / bundle_path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(analysis_dir / rel, dest)
    if (paths.root / "profile").is_dir():  # the profiling pass: traces, windows, tables
        _copy_tree(paths.root / "profile", out / "profile", skip_suffixes=(".tmp",))
    for pattern in WORKFLOW_FILES:
        for src in sorted(repo.glob(pattern)):
            dest = out / "workflow" / src.relative_to(repo)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)

    config = redacted_config({k: v for k, v in exp.to_dict().items() if k not in leave_out})
    (out / "config.resolved.yaml").write_text(
        yaml.safe_dump(config, sort_keys=True, default_flow_style=False), encoding="utf-8"
    )
    started, finished = _run_window(paths)
    model = read_json(model_record)
    runtime = read_json(runtime_record)
    servers: dict[str, Any] = {}
    versions = set()
    for sc_dir in sorted((out / "server").iterdir()):
        launch = read_json(sc_dir / "launch.json") if (sc_dir / "launch.json").exists() else {}
        cap = read_json(sc_dir / "capacity.json") if (sc_dir / "capacity.json").exists() else {}
        versions.add(cap.get("version_endpoint") or cap.get("version"))
        servers[sc_dir.name] = {
            "command": launch.get("command"),
            "env": launch.get("env"),
            "args": launch.get("args"),
            "resolved_args": cap.get("non_default_args"),
            "vllm_version": cap.get("version_endpoint") or cap.get("version"),
        }
    provenance = {
        "format_version": FORMAT_VERSION,
        "experiment": exp.name,
        "model": {
            "source": model["source"],
            "repo": model.get("repo"),
            "revision": model["revision"],
            "files": model["files"],
        },
        "runtime": {
            k: runtime.get(k) for k in RUNTIME_KEYS if k in runtime or k in RUNTIME_KEYS[:5]
        },
        "vllm_version": sorted(v for v in versions if v)[0] if any(versions) else None,
        "servers": servers,
        "host": host_facts() if host is None else host,
        "pipeline": pipeline_facts(repo),
        **_stopping_rule(paths),
        "config": config,
        "started_epoch_ns": started,
        "finished_epoch_ns": finished,
        "started": _iso(started),
        "finished": _iso(finished),
    }
    write_json(out / "provenance.json", provenance)
    _write_ro_crate(out, exp.name, provenance, runtime)
    _write_attestation(out, provenance)
    return _finish(out, exp.name)


def _stopping_rule(paths: ExperimentPaths) -> dict[str, Any]:
    """A sequential sweep's stopping rule, its parameters, the rounds measured and why it
    stopped (run.json `sequential`); nothing for a fixed number of repeats."""
    for run in sorted(paths.root.glob("raw/*/run.json")):
        seq = read_json(run).get("sequential")
        if isinstance(seq, dict):
            return {
                "stopping_rule": {
                    **seq["rule"],
                    "rounds": seq["rounds"],
                    "stopped": seq["stopped"],
                }
            }
    return {}


def _finish(out: Path, experiment: str) -> dict[str, Any]:
    files = [p for p in walk_files(out) if p not in UNLISTED]
    entries = []
    for rel in files:
        name = schema_for(rel)
        entries.append(
            {
                "path": rel,
                "bytes": (out / rel).stat().st_size,
                "sha256": sha256_file(out / rel),
                "role": role_of(rel),
                "schema": schema_id(name) if name else FOREIGN.get(rel),
            }
        )
    manifest = {"format_version": FORMAT_VERSION, "experiment": experiment, "files": entries}
    write_json(out / "manifest.json", manifest)
    all_files = [p for p in walk_files(out) if p != "SHA256SUMS"]
    (out / "SHA256SUMS").write_text(sha256sums_text(out, all_files), encoding="utf-8")
    failures = check_all_json(out, all_files)
    if failures:
        raise ServelabError(
            f"bundle {out}: "
            + failures[0]
            + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else "")
        )
    return manifest


def _write_ro_crate(
    out: Path, experiment: str, prov: dict[str, Any], runtime: dict[str, Any]
) -> None:
    """A Workflow Run Crate: the workflow, one CreateAction per stage, inputs and outputs."""
    from rocrate.model.contextentity import ContextEntity
    from rocrate.rocrate import ROCrate

    crate = ROCrate(gen_preview=False)
    crate.root_dataset["name"] = f"servelab evidence bundle: {experiment}"
    crate.root_dataset["datePublished"] = prov["finished"] or "1970-01-01T00:00:00Z"
    crate.root_dataset["conformsTo"] = [
        {"@id": "https://w3id.org/ro/wfrun/process/0.5"},
        {"@id": "https://w3id.org/ro/wfrun/workflow/0.5"},
    ]
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

    def files(prefix: str) -> list[Any]:
        out_files = []
        for rel in walk_files(out / prefix) if (out / prefix).is_dir() else []:
            path = f"{prefix}/{rel}"
            if path.endswith((".json", ".gz", ".csv", ".svg", ".png", ".log", ".md", ".jsonl")):
                out_files.append(crate.add_file(out / path, path))
        return out_files

    model_files = files("model")
    runtime_files = files("runtime")
    start = prov["started"]
    end = prov["finished"]
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
            result=files(f"raw/{sc}") + files(f"server/{sc}"),
            properties={
                "name": f"sweep: server configuration {sc}",
                "startTime": start,
                "endTime": end,
                "instrument": [{"@id": workflow.id}, {"@id": server_sw.id}],
            },
        )
    tables = files("tables") + files("figures")
    report = crate.add_file(out / "report.md", "report.md")
    crate.add_action(
        workflow,
        identifier="#stage-analysis",
        object=[],
        result=tables + [report],
        properties={"name": "analysis: tables, figures, report"},
    )
    crate.metadata.write(out)
    # rocrate writes indented JSON; re-serialize with sorted keys for stable bytes
    meta = json.loads((out / "ro-crate-metadata.json").read_text(encoding="utf-8"))
    meta["@graph"].sort(key=lambda e: str(e.get("@id")))
    (out / "ro-crate-metadata.json").write_text(
        json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def _runtime_description(runtime: dict[str, Any]) -> str:
    if runtime.get("kind") == "container":
        pin = runtime.get("image_digest") or f"sha256 {runtime.get('image_sha256')}"
        return f"runtime: {runtime.get('engine')} image {runtime.get('image_ref')} ({pin})"
    return f"runtime: {runtime.get('kind')} from lock sha256 {runtime.get('lock_sha256')}"


def _runtime_dependency(rt: dict[str, Any]) -> dict[str, Any]:
    """The runtime as an in-toto resolved dependency: the lock, or the image by digest."""
    if rt.get("kind") == "container":
        digest = str(rt.get("image_digest") or "").removeprefix("sha256:")
        return {
            "uri": f"servelab-runtime-image:{rt.get('image_ref')}",
            "digest": {"sha256": digest or rt.get("image_sha256")},
        }
    return {
        "uri": f"servelab-runtime-lock:{rt['lock']}",
        "digest": {"sha256": rt["lock_sha256"]},
    }


def _write_attestation(out: Path, prov: dict[str, Any]) -> None:
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
                    {
                        "uri": f"servelab-model:{prov['model']['source']}",
                        "digest": {"sha256": prov["model"]["revision"]}
                        if len(prov["model"]["revision"]) == 64
                        else {"gitCommit": prov["model"]["revision"]},
                    },
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
