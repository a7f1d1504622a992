"""The two sides of a comparison, opened and verified.

A side is a release folder (its tarball checked against release.json, then verified, and the
small files beside it checked against the tarball's own), a release tarball, a bundle folder,
results/<experiment> (its bundle when it has one, else its raw data), or a vllm-bench tree.
Releases, tarballs and bundles that do not verify are refused, naming the first failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Required, TypedDict

import yaml

from servelab.analysis.benchtree import vllm_bench_files
from servelab.analysis.dataset import detect_layout
from servelab.analysis.peers import tool_version
from servelab.analysis.pipeline import analysis_section
from servelab.documents import JsonObject, JsonValue
from servelab.documents.declared import Provenance, SideFacts
from servelab.errors import ServelabError
from servelab.evidence.files import safe_extract
from servelab.evidence.verify import check_release_folder, is_release_folder, verify
from servelab.experiment import AnalysisSection
from servelab.store.jsonio import read_json

# what a vllm-bench tree says about its setup (BENCH_FACTS): names, and numbers for a tree at
# request rates (an infinite burstiness as "inf")
BenchFacts = dict[str, str | float]

# a vLLM argument's value in a config (server.args, server.configs[].args)
ArgValue = str | int | float | bool
# a configuration's own runtime (server.configs[].runtime): lock, image, image_sha256, each a
# string or null
ConfigRuntimeJson = dict[str, str | None]


class ServerConfigJson(TypedDict, total=False):
    """A server configuration of a config (server.configs[]): its name, its arguments over the
    shared ones and its own runtime, if any."""

    name: Required[str]
    args: dict[str, ArgValue]
    runtime: ConfigRuntimeJson | None


class ServerJson(TypedDict, total=False):
    """A config's `server` section (config.schema.yaml)."""

    host: str
    port: int
    startup_timeout_s: float
    shutdown_timeout_s: float
    lock_timeout_s: float
    engine_nice: int
    args: dict[str, ArgValue]
    configs: list[ServerConfigJson]


class RuntimeConfigJson(TypedDict, total=False):
    """A config's `runtime` section (config.schema.yaml)."""

    kind: str
    url: str | None
    served_model: str | None
    lock: str
    cache_dir: str | None
    compile_cache: bool
    device: str
    gpus: int
    image: str | None
    image_sha256: str | None
    gpu_devices: list[JsonValue] | None
    mounts: list[JsonValue]
    network: str
    shm_size: str | None
    extra_args: list[str]
    env: dict[str, str]


class ResolvedConfig(TypedDict, total=False):
    """A resolved experiment config (config.resolved.yaml, checked against config.schema.yaml
    when it was resolved): the sections servelab.reproduce reads typed, the others as the JSON
    objects they are."""

    experiment: str
    results_dir: str
    model: JsonObject
    runtime: RuntimeConfigJson
    server: ServerJson
    workload: JsonObject
    sweep: JsonObject
    telemetry: JsonObject
    analysis: JsonObject
    reference: str | None
    reproduction: JsonObject
    bisect: JsonObject
    confirm: JsonObject
    search: JsonObject
    profile: JsonObject


@dataclass
class Side:
    """One side of a comparison, opened and (for bundles and releases) verified."""

    given: str
    kind: str  # release | tarball | bundle | experiment | vllm-bench
    root: Path
    config: ResolvedConfig | None = None
    provenance: Provenance | None = None
    release: JsonObject | None = None
    bench_facts: BenchFacts = field(default_factory=dict)

    @property
    def analysis(self) -> AnalysisSection:
        """The side's recorded `analysis:` section (its claims, thresholds and validity
        checks), keys it lacks (newer than the side) at the schema's defaults; the defaults for
        a side that records no config (raw results, a vllm-bench tree)."""
        return analysis_section((self.config or {}).get("analysis"))

    def describe(self) -> SideFacts:
        out: SideFacts = {"path": self.given, "kind": self.kind}
        if self.release:
            tag, sha256, pinned = (self.release.get(k) for k in ("tag", "tarball_sha256", "pinned"))
            out["tag"] = tag if isinstance(tag, str) else None
            out["tarball_sha256"] = sha256 if isinstance(sha256, str) else None
            out["pinned"] = pinned if isinstance(pinned, bool) else None
        if self.provenance:
            out["experiment"] = self.provenance.get("experiment")
            out["started"] = self.provenance.get("started")
        return out


def refusal(path: Path, failures: list[str], what: str) -> ServelabError:
    """The one-line error refusing `path` (the path the user gave) as `what`: its first
    failure, how many more, and the command that lists them all."""
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return ServelabError(
        f"{path}: {what} does not verify: {failures[0]}{more}; "
        f"run `servelab verify {path}` for every failure"
    )


def _verified(root: Path, label: Path, what: str) -> Path:
    """`root` (a bundle folder, or a tarball already extracted safely) when it verifies;
    failures are named after `label`, the path the user gave."""
    failures = verify(root)
    if failures:
        raise refusal(label, failures, what)
    return root


def _open_release(path: Path, workdir: Path, what: str) -> tuple[Path, JsonObject]:
    """The bundle of the release folder `path`, extracted into workdir, and its release.json,
    when the folder verifies (`check_release_folder`); refused naming the first failure."""
    checked = check_release_folder(path, workdir)
    if checked.failures or checked.root is None:
        raise refusal(path, checked.failures, what)
    return checked.root, checked.release


def open_side(path: Path, workdir: Path, what: str = "reference") -> Side:
    """Open a release dir, a release tarball, a bundle, an experiment dir or a vllm-bench tree.

    Releases, tarballs and bundles are verified (checksums, manifest, schemas) first; a side
    that does not verify is refused."""
    if not path.exists():
        raise ServelabError(
            f"{path}: {what} not found; give a release folder, a .tar.gz, a "
            "bundle, an experiment folder or a vllm-bench tree"
        )
    if is_release_folder(path):
        root, rel = _open_release(path, workdir, what)
        return bundle_side(str(path), "release", root, rel)
    if path.is_file():
        if not path.name.endswith(".tar.gz"):
            raise ServelabError(f"{path}: not a .tar.gz release; give the release folder")
        root = _verified(safe_extract(path, workdir), path, what)
        return bundle_side(str(path), "tarball", root, None)
    if (path / "manifest.json").is_file():
        return bundle_side(str(path), "bundle", _verified(path, path, what), None)
    if (path / "bundle" / "manifest.json").is_file():
        return open_side(path / "bundle", workdir, what)
    layout = detect_layout(path)
    if layout == "vllm-bench":
        return Side(str(path), "vllm-bench", path, bench_facts=_bench_facts(path))
    return Side(str(path), "experiment", path)


def bundle_side(given: str, kind: str, root: Path, rel: JsonObject | None) -> Side:
    """The side of the bundle folder `root`, which the caller has verified (`open_side`, or
    a release folder's check, evidence.verify.check_release_folder, whose extracted bundle
    `root` is): its resolved config and provenance.json read, nothing verified again. `given`
    is the path the user gave, `kind` what it is, `rel` its release.json (None for a side
    that is not a release folder)."""
    cfg = yaml.safe_load((root / "config.resolved.yaml").read_text(encoding="utf-8"))
    return Side(given, kind, root, cfg, read_json(root / "provenance.json"), rel)


BENCH_FACTS = ("model_id", "tokenizer_id", "backend", "endpoint_type", "label")
# and, for a tree of runs at request rates, the arrival process and the cap on requests in flight
BENCH_RATE_FACTS = ("burstiness", "max_concurrency")


def _bench_facts(root: Path) -> BenchFacts:
    """What a vllm-bench tree says about its setup (from its first benchmark.json)."""
    files = vllm_bench_files(root)
    if not files:
        return {}
    made_by = tool_version(files[0].path, files[0].tool)
    if made_by is not None:  # another tool's results: which tool and version wrote them
        return {"tool": made_by}
    data = json.loads(files[0].path.read_text(encoding="utf-8"))
    keys = BENCH_FACTS + (BENCH_RATE_FACTS if files[0].axis == "rate" else ())
    # an infinite burstiness (constant gaps) as its JSON can hold it
    return {
        k: "inf" if data[k] == float("inf") else data[k] for k in keys if data.get(k) is not None
    }
