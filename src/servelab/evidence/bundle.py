"""Build the evidence bundle of one experiment (docs/bundle.md)."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

import yaml

from servelab.documents import JsonValue
from servelab.documents.declared import (
    HostFacts,
    Manifest,
    ManifestEntry,
    Provenance,
    ProvenanceRuntime,
)
from servelab.env.client_tools import TOOLS
from servelab.env.endpoint import KIND as ENDPOINT, NOT_LAUNCHED
from servelab.env.model import RECORD as MODEL_RECORD
from servelab.errors import ServelabError
from servelab.evidence.crate import UNLISTED, write_attestation, write_ro_crate
from servelab.evidence.documents import (
    ConfirmsPart,
    DatasetPart,
    EndpointPart,
    ServerFacts,
    StoppingRulePart,
    model_facts,
)
from servelab.evidence.files import sha256sums_text, walk_files
from servelab.evidence.provenance import (
    config_runtimes,
    host_facts,
    host_speed,
    pipeline_facts,
    redacted_config,
)
from servelab.evidence.replay import trace_part
from servelab.evidence.schemas import check_all_json, foreign, schema_for, schema_id
from servelab.experiment import ConfirmsSection, Experiment
from servelab.store.hashing import pinned_bytes, sha256_file
from servelab.store.jsonio import read_json, write_json
from servelab.store.paths import ANALYSIS_REPORT, POINT_FILE, SERVER_LOG, ExperimentPaths
from servelab.store.records import (
    CapacityRecord,
    ClientsRecord,
    LaunchRecord,
    PointRecord,
    RunRecord,
    RuntimeRecord,
    WarmupRecord,
)

if TYPE_CHECKING:
    from servelab.documents.declared import SequentialRecord

FORMAT_VERSION = 1
# runtime.json keys carried into provenance.json: the first five always (venv), the others when
# present (containers: the engine, the image and the digest actually run, vLLM in it, the GPUs
# chosen for the run; isa: the CPU instruction set PyTorch and oneDNN use in the runtime)
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
    # a GPU container runtime: the GPUs every launch of the run was given (ids, indices, why)
    "gpu_choice",
    # runtime.kind endpoint: the server as it described itself (servelab.env.endpoint.probe)
    "launched",
    "url",
    "served_model",
    "model",
    "models",
    "version",
    "server_info",
    "local",
)
# what a run on a server servelab did not launch leaves unpinned (provenance.json `endpoint`)
UNPINNED = (
    "its runtime (no lock, no image), its command line and arguments and its model files are "
    "not pinned; provenance records what the server said of itself"
)
WORKFLOW_FILES = [
    "Snakefile",
    "rules/*.smk",
    "scripts/*.py",
    "src/servelab/schemas/config.schema.yaml",
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
    """The first start and the last finish the raw data records: every point's (incomplete
    ones, re-measures and the warm-ups too) and every launch's start."""
    starts, ends = [], []
    points = [
        *paths.raw.glob(f"*/rep*/*/{POINT_FILE}"),
        *paths.raw.glob(f"*/rep*/*/*/{POINT_FILE}"),
    ]
    for pj in sorted(points):
        point: PointRecord = PointRecord.read(pj)
        starts.append(point.started_epoch_ns)
        ends.append(point.finished_epoch_ns)
    for pj in paths.warmup_files():
        point = WarmupRecord.read(pj)
        starts.append(point.started_epoch_ns)
        ends.append(point.finished_epoch_ns)
    for lj in paths.launch_files():
        starts.append(LaunchRecord.read(lj).started_epoch_ns)
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
    host: HostFacts | None = None,
) -> Manifest:
    """Assemble, describe and validate the bundle of the experiment in `paths` into `out`
    (replaced if present). `repo`: the checkout whose workflow files are copied. The resolved
    config is recorded without the top-level keys in `leave_out` (the workflow leaves out
    those its bundle rule does not see). `host`: the host facts to record (None: this host's,
    the normal case)."""
    model_record = paths.model / MODEL_RECORD
    for need in (paths.raw, paths.analysis / ANALYSIS_REPORT, model_record, paths.runtime_record):
        if not need.exists():
            raise ServelabError(f"{need}: missing; run the workflow up to the analysis first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _copy_inputs(paths, out, repo)
    _copy_locks(exp, paths, out, repo)
    config = redacted_config({k: v for k, v in exp.to_dict().items() if k not in leave_out})
    (out / "config.resolved.yaml").write_text(
        yaml.safe_dump(config, sort_keys=True, default_flow_style=False), encoding="utf-8"
    )
    provenance = _provenance(exp, paths, out, repo, config, host)
    write_json(out / "provenance.json", provenance)
    # the runtime's facts the crate describes are all among those provenance.json carries
    write_ro_crate(out, exp.name, provenance, provenance["runtime"])
    write_attestation(out, provenance)
    return _finish(out, exp.name)


def _copy_inputs(paths: ExperimentPaths, out: Path, repo: Path) -> None:
    """The raw data, each configuration's server files, the model and runtime records, the
    analysis, the profiling pass and the workflow files, copied into the bundle `out`."""
    _copy_tree(paths.raw, out / "raw", skip_suffixes=(".tmp",))
    for sc_dir in sorted(paths.servers.iterdir()):
        for name in (SERVER_LOG, LaunchRecord.FILE, CapacityRecord.FILE):
            if (sc_dir / name).exists():
                (out / "server" / sc_dir.name).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(sc_dir / name, out / "server" / sc_dir.name / name)
    (out / "model").mkdir()
    shutil.copyfile(paths.model / MODEL_RECORD, out / "model" / MODEL_RECORD)
    # the shared runtime's record, and those of configurations with their own (runtime/<sc>/)
    # and client.cross_check's tools (runtime/clients.json)
    clients = [paths.clients_record] if paths.clients_record.is_file() else []
    for rec in [paths.runtime_record, *paths.config_runtime_records(), *clients]:
        (out / rec.relative_to(paths.root)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(rec, out / rec.relative_to(paths.root))
    for rel in walk_files(paths.analysis):
        dest = out / bundle_path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths.analysis / rel, dest)
    if paths.profiles.is_dir():  # the profiling pass: traces, windows, tables
        _copy_tree(paths.profiles, out / "profile", skip_suffixes=(".tmp",))
    for pattern in WORKFLOW_FILES:
        for src in sorted(repo.glob(pattern)):
            dest = out / "workflow" / src.relative_to(repo)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)


def _copy_locks(exp: Experiment, paths: ExperimentPaths, out: Path, repo: Path) -> None:
    """The bytes of each hashed lock a venv runtime was created from, beside its record
    (runtime/<lock name>, runtime/<sc>/<lock name>): what a rerun of this bundle on another
    host rebuilds the runtime from (servelab.reproduce.rerun). The lock is read where the
    config names it and must still hash as the record says; otherwise it is not the run's."""
    records = [(paths.runtime_record, exp.runtime)]
    for rec in paths.config_runtime_records():
        sc = rec.parent.name
        if sc in exp.server.names:
            records.append((rec, exp.runtime_of(sc)))
    for rec, runtime in records:
        doc = RuntimeRecord.read(rec).doc
        if doc.get("kind") != "venv" or not doc.get("lock_sha256"):
            continue
        src = Path(runtime.lock) if Path(runtime.lock).is_absolute() else repo / runtime.lock
        data = pinned_bytes(src, doc["lock_sha256"])
        if data is None:
            raise ServelabError(
                f"{src}: not the lock {rec} was created from (sha256 {doc['lock_sha256'][:16]}); "
                "restore that lock, or measure the run again with this one"
            )
        dest = out / rec.relative_to(paths.root).parent / src.name
        dest.write_bytes(data)
    _copy_tool_locks(paths, out, repo)


def _copy_tool_locks(paths: ExperimentPaths, out: Path, repo: Path) -> None:
    """The locks client.cross_check's tools were installed from (envs/<lock>, as
    servelab.env.client_tools names them), beside runtime/clients.json; vllm bench serve's is
    the server runtime's, copied above."""
    clients = ClientsRecord.read_if_present(paths.clients_record)
    for tool in [] if clients is None else clients.doc["tools"].values():
        spec = TOOLS.get(tool["tool"])
        if spec is None or spec.lock is None:
            continue
        src = repo / "envs" / spec.lock
        data = pinned_bytes(src, tool["lock_sha256"])
        if data is None:
            raise ServelabError(
                f"{src}: not the lock {tool['tool']} was installed from (sha256 "
                f"{tool['lock_sha256'][:16]}); restore that lock, or measure the run again"
            )
        (out / "runtime" / spec.lock).write_bytes(data)


def _servers(bundled: ExperimentPaths) -> tuple[dict[str, ServerFacts], str | None]:
    """Per server configuration in the bundle, its launch command, environment and arguments
    and what its server resolved; and the vLLM version the servers report (the first by name
    when they differ, None when none does)."""
    servers: dict[str, ServerFacts] = {}
    versions = set()
    for sc_dir in sorted(bundled.servers.iterdir()):
        launch = LaunchRecord.read_if_present(bundled.launch(sc_dir.name))
        cap = CapacityRecord.read_if_present(bundled.capacity(sc_dir.name))
        version = cap.vllm_version if cap is not None else None
        versions.add(version)
        servers[sc_dir.name] = {
            # false for a server servelab did not launch (runtime.kind endpoint)
            "launched": launch.get("launched", True) if launch else None,
            "command": launch.get("command") if launch else None,
            "env": launch.get("env") if launch else None,
            "args": launch.get("args") if launch else None,
            "resolved_args": cap.get("non_default_args") if cap else None,
            "vllm_version": version,
        }
    return servers, sorted(v for v in versions if v)[0] if any(versions) else None


def _provenance(
    exp: Experiment,
    paths: ExperimentPaths,
    out: Path,
    repo: Path,
    config: dict[str, object],
    host: HostFacts | None,
) -> Provenance:
    """provenance.json: the model, the runtime, the servers (as bundled in `out`), the host,
    the pipeline, the optional parts, the config and when the measurement ran."""
    started, finished = _run_window(paths)
    model = read_json(paths.model / MODEL_RECORD)
    runtime = RuntimeRecord.read(paths.runtime_record).doc
    servers, vllm_version = _servers(ExperimentPaths(out))
    return {
        "format_version": FORMAT_VERSION,
        "experiment": exp.name,
        "model": model_facts(model),
        # runtime.json's keys provenance.schema.json declares for `runtime` (RUNTIME_KEYS)
        "runtime": cast(
            ProvenanceRuntime,
            {k: runtime.get(k) for k in RUNTIME_KEYS if k in runtime or k in RUNTIME_KEYS[:5]},
        ),
        "vllm_version": vllm_version,
        "servers": servers,
        "host": host_facts() if host is None else host,
        "pipeline": pipeline_facts(repo),
        **_endpoint(runtime),
        **_dataset(paths),
        **trace_part(paths),
        **_stopping_rule(paths),
        **host_speed(paths),
        **config_runtimes(paths, exp.server.own_runtime),
        **_confirms(exp.analysis.confirms),
        "config": config,
        "started_epoch_ns": started,
        "finished_epoch_ns": finished,
        "started": _iso(started),
        "finished": _iso(finished),
    }


def _endpoint(runtime: Mapping[str, object]) -> EndpointPart:
    """A run on a server servelab did not launch (runtime.kind endpoint): `endpoint`, its URL
    and served model, marked not launched by servelab, and what servelab therefore does not
    pin; nothing for any other run."""
    if runtime.get("kind") != ENDPOINT:
        return {}
    url, served = runtime.get("url"), runtime.get("served_model")
    if not isinstance(url, str) or not isinstance(served, str):  # runtime.schema.json's
        raise ServelabError("runtime.json: an endpoint runtime without its url and served_model")
    return {
        "endpoint": {
            "url": url,
            "served_model": served,
            "launched": False,
            "note": f"{NOT_LAUNCHED}: {UNPINNED}",
        }
    }


def _dataset(paths: ExperimentPaths) -> DatasetPart:
    """A dataset workload's file (path or hub file, revision, sha256) and what each server
    configuration sampled from it (raw/<sc>/dataset.json less the file); one file for all."""
    file: JsonValue = None
    samples: dict[str, Mapping[str, object]] = {}
    for sc_dir in sorted(p for p in paths.raw.iterdir() if p.is_dir()):
        path = paths.dataset(sc_dir.name)
        if not path.exists():
            continue
        record = read_json(path)
        if file is not None and record.get("file") != file:
            raise ServelabError(
                f"{path}: sampled from another dataset file than the other configurations "
                f"({record.get('file', {}).get('sha256')} vs {_sha256_of(file)}); measure "
                "every configuration on one dataset"
            )
        file = record.get("file")
        samples[sc_dir.name] = {k: v for k, v in record.items() if k != "file"}
    if file is None:
        return {}
    return {"dataset": {"file": file, "samples": samples}}


def _text(value: object) -> str | None:
    """runtime.json's url or served model (a string; None where it has none)."""
    return value if isinstance(value, str) else None


def _sha256_of(file: JsonValue) -> JsonValue:
    """dataset.json's `file`'s sha256."""
    return file.get("sha256") if isinstance(file, dict) else None


def _stopping_rule(paths: ExperimentPaths) -> StoppingRulePart:
    """A sequential sweep's stopping rule, its parameters, the rounds measured and why it
    stopped (run.json `sequential`); nothing for a fixed number of repeats."""
    for run in paths.run_files():
        found = RunRecord.read(run).sequential
        if found is not None:
            seq = cast("SequentialRecord", found)  # as run.json's schema has checked it
            return {
                "stopping_rule": {
                    **seq["rule"],
                    "rounds": seq["rounds"],
                    "stopped": seq["stopped"],
                }
            }
    return {}


def _confirms(confirms: ConfirmsSection | None) -> ConfirmsPart:
    """A confirmation experiment's `confirms` (analysis.confirms): the diagnosing experiment,
    its bundle and that bundle's manifest.json sha256 (which `servelab verify` checks), which
    diagnoses led to which change of which configuration, and the proposals not measured;
    nothing for any other experiment."""
    if confirms is None:
        return {}
    return {
        "confirms": {
            "experiment": confirms.experiment,
            "bundle": confirms.bundle,
            "manifest_sha256": confirms.manifest_sha256,
            "changes": [
                {
                    "id": p.id,
                    "diagnoses": list(p.diagnoses),
                    "server_config": p.server_config,
                    "config": p.config,
                    "change": dict(p.change),
                }
                for p in confirms.proposals
            ],
            "not_tried": [n.to_json() for n in confirms.not_tried],
        }
    }


def _finish(out: Path, experiment: str) -> Manifest:
    files = [p for p in walk_files(out) if p not in UNLISTED]
    entries: list[ManifestEntry] = []
    for rel in files:
        name = schema_for(rel)
        entries.append(
            {
                "path": rel,
                "bytes": (out / rel).stat().st_size,
                "sha256": sha256_file(out / rel),
                "role": role_of(rel),
                "schema": schema_id(name) if name else foreign(rel),
            }
        )
    manifest: Manifest = {
        "format_version": FORMAT_VERSION,
        "experiment": experiment,
        "files": entries,
    }
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
