"""Compare a fresh run with a reference (a frozen release, a bundle, or a vllm-bench tree).

Both sides are re-analysed from their raw data with the same options (the reference's), so
the comparison never trusts a table it could recompute. What decides the verdict:

- orderings: every paired difference the reference called real (for the judged metrics and at
  least `min_effect_pct`): the fresh run must show it in the same direction, and, by default,
  call it real too;
- claims: every claim of the reference, re-evaluated on the fresh data, must come out as it did
  in the reference;
- absolute values only when a tolerance is set (they move between hosts);
- provenance: a different model revision, runtime, vLLM version, GPU model or measured
  configuration makes the comparison NOT COMPARABLE whatever the numbers say;
- the host never decides the verdict, but every host-fact difference is classified as
  performance-relevant or not (`hostfacts.compare_hosts`) and the verdict text says which host
  it was reached on: one that differs (naming how), an equivalent one (a failure there is a
  regression), or one not known to be equivalent.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from servelab.analysis.claims import evaluate_claims
from servelab.analysis.claims_syntax import parse_claim
from servelab.analysis.dataset import Dataset, detect_layout, load_dataset
from servelab.analysis.diagnoses import diagnoses
from servelab.analysis.groups import PAIRED_METRICS, Groups, paired_table
from servelab.analysis.knee import dominance, knee
from servelab.analysis.pipeline import analysis_section
from servelab.analysis.stats import describe
from servelab.errors import ServelabError
from servelab.evidence.files import safe_extract
from servelab.evidence.schemas import validate_file
from servelab.evidence.verify import verify
from servelab.experiment import AnalysisSection
from servelab.hashing import check_pinned
from servelab.hostfacts import compare_hosts, host_qualifier
from servelab.jsonio import read_json, write_json

REPRODUCED = "REPRODUCED"
NOT_REPRODUCED = "NOT REPRODUCED"
NOT_COMPARABLE = "NOT COMPARABLE"
FORMAT_VERSION = 1
POINT_METRICS = PAIRED_METRICS
SHORT = {
    "output_throughput": "tok/s",
    "mean_ttft_ms": "mean TTFT ms",
    "p99_ttft_ms": "p99 TTFT ms",
    "mean_tpot_ms": "mean TPOT ms",
    "p99_tpot_ms": "p99 TPOT ms",
}


@dataclass(frozen=True)
class Settings:
    """How strictly the fresh run must match (config key `reproduction`, docs/config.md)."""

    metrics: tuple[str, ...] = tuple(PAIRED_METRICS)
    min_effect_pct: float = 0.0
    require_significance: bool = True
    tolerance_pct: float | None = None
    tolerance_metrics: tuple[str, ...] = ("output_throughput",)
    extra_claims: tuple[str, ...] = ()

    @staticmethod
    def from_config(cfg: dict[str, Any] | None) -> Settings:
        cfg = cfg or {}
        d = Settings()
        tol = cfg.get("tolerance_pct")
        return Settings(
            metrics=tuple(cfg.get("metrics") or d.metrics),
            min_effect_pct=float(cfg.get("min_effect_pct", d.min_effect_pct)),
            require_significance=bool(cfg.get("require_significance", True)),
            tolerance_pct=None if tol is None else float(tol),
            tolerance_metrics=tuple(cfg.get("tolerance_metrics") or d.tolerance_metrics),
            extra_claims=tuple(cfg.get("claims") or ()),
        )


@dataclass
class Side:
    """One side of a comparison, opened and (for bundles and releases) verified."""

    given: str
    kind: str  # release | tarball | bundle | experiment | vllm-bench
    root: Path
    config: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    release: dict[str, Any] | None = None
    bench_facts: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.given, "kind": self.kind}
        if self.release:
            out["tag"] = self.release.get("tag")
            out["tarball_sha256"] = self.release.get("tarball_sha256")
            out["pinned"] = self.release.get("pinned")
        if self.provenance:
            out["experiment"] = self.provenance.get("experiment")
            out["started"] = self.provenance.get("started")
        return out


def _refuse(path: Path, failures: list[str], what: str) -> ServelabError:
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
        raise _refuse(label, failures, what)
    return root


def _open_release(path: Path, workdir: Path, what: str) -> tuple[Path, dict[str, Any]]:
    rel = read_json(path / "release.json")
    tarball = path / str(rel.get("tarball", ""))
    if not tarball.is_file():
        raise ServelabError(f"{tarball}: the release's tarball is missing")
    check_pinned(
        tarball,
        rel.get("tarball_sha256"),
        lambda d: (
            f"{tarball}: sha256 {d[:12]}... differs from release.json "
            f"({str(rel.get('tarball_sha256'))[:12]}...): the {what} was altered; fetch it again"
        ),
    )
    root = _verified(safe_extract(tarball, workdir), tarball, what)
    # The small files beside the tarball must be the tarball's own.
    for name in ("manifest.json", "provenance.json", "SHA256SUMS"):
        if (path / name).exists() and (path / name).read_bytes() != (root / name).read_bytes():
            raise ServelabError(
                f"{path / name}: differs from the copy inside {tarball.name}: the {what} was "
                "altered; fetch it again"
            )
    return root, rel


def open_side(path: Path, workdir: Path, what: str = "reference") -> Side:
    """Open a release dir, a release tarball, a bundle, an experiment dir or a vllm-bench tree.

    Releases, tarballs and bundles are verified (checksums, manifest, schemas) first; a side
    that does not verify is refused."""
    if not path.exists():
        raise ServelabError(
            f"{path}: {what} not found; give a release folder, a .tar.gz, a "
            "bundle, an experiment folder or a vllm-bench tree"
        )
    if path.is_dir() and (path / "release.json").is_file():
        root, rel = _open_release(path, workdir, what)
        return _bundle_side(str(path), "release", root, rel)
    if path.is_file():
        if not path.name.endswith(".tar.gz"):
            raise ServelabError(f"{path}: not a .tar.gz release; give the release folder")
        root = _verified(safe_extract(path, workdir), path, what)
        return _bundle_side(str(path), "tarball", root, None)
    if (path / "manifest.json").is_file():
        return _bundle_side(str(path), "bundle", _verified(path, path, what), None)
    if (path / "bundle" / "manifest.json").is_file():
        return open_side(path / "bundle", workdir, what)
    layout = detect_layout(path)
    if layout == "vllm-bench":
        return Side(str(path), "vllm-bench", path, bench_facts=_bench_facts(path))
    return Side(str(path), "experiment", path)


def _bundle_side(given: str, kind: str, root: Path, rel: dict[str, Any] | None) -> Side:
    cfg = yaml.safe_load((root / "config.resolved.yaml").read_text(encoding="utf-8"))
    return Side(given, kind, root, cfg, read_json(root / "provenance.json"), rel)


BENCH_FACTS = ("model_id", "tokenizer_id", "backend", "endpoint_type", "label")


def _bench_facts(root: Path) -> dict[str, Any]:
    """What a vllm-bench tree says about its setup (from its first benchmark.json)."""
    files = sorted(root.glob("rep_*/concurrency_*/benchmark.json"))
    if not files:
        return {}
    data = json.loads(files[0].read_text(encoding="utf-8"))
    return {k: data[k] for k in BENCH_FACTS if data.get(k) is not None}


# --- the analysis of each side ------------------------------------------------------------


@dataclass
class Analysed:
    ds: Dataset
    g: Groups
    paired: list[dict[str, Any]]
    knee: list[dict[str, Any]]
    dominance: list[dict[str, Any]]
    diagnoses: list[dict[str, Any]]


def _analyse(ds: Dataset, opts: AnalysisSection) -> Analysed:
    g = Groups(ds)
    opts = replace(opts, claims=())
    kn = knee(g, opts)
    dom = dominance(g)
    return Analysed(ds, g, paired_table(g, opts), kn, dom, diagnoses(g, ds, kn, dom, opts))


def _claim(a: Analysed, opts: AnalysisSection, claim: str) -> dict[str, Any]:
    res = evaluate_claims(a.g, replace(opts, claims=(claim,)), a.knee, a.dominance, a.diagnoses)
    return res[0]


def _align(ref: Dataset, new: Dataset) -> str | None:
    """One configuration on each side under different names (vllm-bench trees are named after
    their folder): compare them as one. Returns a note when renamed."""
    rc, nc = ref.configs(), new.configs()
    if rc == nc or len(rc) != 1 or len(nc) != 1:
        return None
    for p in new.points:
        p.server_config = rc[0]
    new.capacity = {rc[0]: next(iter(new.capacity.values()))} if new.capacity else {}
    return f"fresh configuration {nc[0]!r} compared with reference configuration {rc[0]!r}"


# --- provenance ---------------------------------------------------------------------------


# (field, getter) pairs; a difference in one of these makes the comparison NOT COMPARABLE.
def _gpu_models(p: dict[str, Any]) -> Any:
    gpus = p.get("host", {}).get("gpus") or []
    return sorted(str(g.get("name")) for g in gpus) or None


def _image_digest(p: dict[str, Any]) -> Any:
    rt = p.get("runtime", {})
    for key in ("image_digest", "digest", "image_id"):
        if rt.get(key):
            return rt[key]
    image = str(rt.get("image") or "")
    return image.split("@", 1)[1] if "@" in image else None


def _cfg(section: str, *keys: str) -> Any:
    def get(p: dict[str, Any]) -> Any:
        v: Any = (p.get("config") or {}).get(section)
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    return get


def _at(*keys: str) -> Any:
    def get(p: dict[str, Any]) -> Any:
        v: Any = p
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    return get


# workload keys compared as notes (NOTES), not as part of the blocking `config.workload`
NOTED_WORKLOAD_KEYS = frozenset({"unique_prompts"})


def _workload(p: dict[str, Any]) -> Any:
    w = _cfg("workload")(p)
    if not isinstance(w, dict):
        return w
    return {k: v for k, v in w.items() if k not in NOTED_WORKLOAD_KEYS}


BLOCKING: list[tuple[str, Any]] = [
    ("model.source", _at("model", "source")),
    ("model.repo", _at("model", "repo")),
    ("model.revision", _at("model", "revision")),
    ("runtime.kind", _at("runtime", "kind")),
    ("runtime.lock_sha256", _at("runtime", "lock_sha256")),
    ("runtime.image_digest", _image_digest),
    ("vllm_version", _at("vllm_version")),
    ("host.gpu_models", _gpu_models),
    ("config.server.args", _cfg("server", "args")),
    ("config.server.configs", _cfg("server", "configs")),
    ("config.runtime.env", _cfg("runtime", "env")),
    ("config.workload", _workload),
    ("config.sweep.concurrency", _cfg("sweep", "concurrency")),
]
# Worth knowing, not blocking.
NOTES: list[tuple[str, Any]] = [
    ("pipeline.git_commit", _at("pipeline", "git_commit")),
    ("pipeline.servelab_version", _at("pipeline", "servelab_version")),
    ("pipeline.snakemake_version", _at("pipeline", "snakemake_version")),
    ("config.sweep.repeats", _cfg("sweep", "repeats")),
    ("config.sweep.order", _cfg("sweep", "order")),
    ("config.analysis", _cfg("analysis")),
    ("config.profile.enabled", _cfg("profile", "enabled")),
    # whether points resend the same prompts matters only with prefix caching, which the
    # prefix_cache validity check catches on every point of either side
    ("config.workload.unique_prompts", _cfg("workload", "unique_prompts")),
]


def provenance_diff(ref: Side, new: Side, host: dict[str, Any]) -> dict[str, Any]:
    """Field by field: what differs, and whether it stops the comparison being clean-room.
    `host` is the hosts' comparison (`compare_hosts`), whose differing facts are listed too."""
    rows: list[dict[str, Any]] = []
    flags: list[str] = []
    if ref.provenance is None or new.provenance is None:
        missing = [w for w, side in (("reference", ref), ("fresh", new)) if not side.provenance]
        kinds = ", ".join(sorted({ref.kind, new.kind}))
        flags.append(
            f"no provenance for the {' and '.join(missing)} side ({kinds}): "
            "model, runtime and host cannot be compared"
        )
        for key in sorted(set(ref.bench_facts) | set(new.bench_facts)):
            a, b = ref.bench_facts.get(key), new.bench_facts.get(key)
            rows.append(
                {
                    "field": f"benchmark.{key}",
                    "reference": a,
                    "fresh": b,
                    "same": a == b,
                    "effect": "blocks" if key != "label" else "note",
                }
            )
    else:
        for kind, table in (("blocks", BLOCKING), ("note", NOTES)):
            for name, get in table:
                a, b = get(ref.provenance), get(new.provenance)
                if a is None and b is None:
                    continue
                rows.append(
                    {"field": name, "reference": a, "fresh": b, "same": a == b, "effect": kind}
                )
        if host["class"] == "identical":
            flags.append(
                "every host fact is the same (CPU, cores, memory, OS, kernel): the same "
                "machine or an identical one, not shown to be another host"
            )
        if new.provenance.get("pipeline", {}).get("git_dirty"):
            flags.append("the fresh run's pipeline had uncommitted changes")
        if ref.provenance.get("pipeline", {}).get("git_dirty"):
            flags.append("the reference's pipeline had uncommitted changes")
    if ref.release is not None and ref.release.get("pinned") is False:
        flags.append(
            "the reference release is marked unpinned: "
            + "; ".join(ref.release.get("unpinned_reasons") or [])
        )
    blocking = [r["field"] for r in rows if r["effect"] == "blocks" and not r["same"]]
    for f in blocking:
        flags.append(f"{f} differs: not the same experiment")
    host_differs = [d["fact"] for d in host["relevant_differences"] + host["other_differences"]]
    return {
        "fields": rows,
        "differs": [r["field"] for r in rows if not r["same"]] + host_differs,
        "blocking": blocking,
        "not_clean_room": flags,
    }


# --- the comparison -----------------------------------------------------------------------


def _pct_change(ref: float | None, new: float | None) -> float | None:
    if ref is None or new is None or ref == 0:
        return None
    return 100.0 * (new / ref - 1.0)


def _points(ref: Analysed, new: Analysed, s: Settings) -> list[dict[str, Any]]:
    rows = []
    for sc in ref.g.configs:
        for c in ref.g.levels(sc):
            for m in POINT_METRICS:
                rv = list(ref.g.values(sc, c, m).values())
                nv = list(new.g.values(sc, c, m).values())
                rd, nd = describe(rv), describe(nv)
                change = _pct_change(rd.mean, nd.mean)
                judged = s.tolerance_pct is not None and m in s.tolerance_metrics
                if not nv:
                    status = "missing"
                elif not judged:
                    status = "reported"
                elif change is not None and abs(change) <= float(s.tolerance_pct or 0):
                    status = "within tolerance"
                else:
                    status = "outside tolerance"
                rows.append(
                    {
                        "server_config": sc,
                        "concurrency": c,
                        "metric": m,
                        "reference_mean": rd.mean,
                        "fresh_mean": nd.mean,
                        "change_pct": change,
                        "reference_cv_pct": rd.cv_pct,
                        "fresh_cv_pct": nd.cv_pct,
                        "reference_n": rd.n,
                        "fresh_n": nd.n,
                        "status": status,
                        "verdict": {
                            "missing": NOT_COMPARABLE if judged else None,
                            "within tolerance": REPRODUCED,
                            "outside tolerance": NOT_REPRODUCED,
                        }.get(status),
                    }
                )
    return rows


def _by_pair(paired: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows of a paired table by (config, a, b, metric)."""
    return {(r["server_config"], r["a"], r["b"], r["metric"]): r for r in paired}


def _real(verdict: str | None) -> bool:
    return verdict in ("a > b", "a < b")


def _invalid(verdict: str | None) -> bool:
    """A paired row or claim that the validity checks left without data (docs/analysis.md)."""
    return verdict is not None and (verdict == "invalid" or verdict.startswith("invalid:"))


def _pairs(ref: Analysed, new: Analysed, s: Settings) -> list[dict[str, Any]]:
    fresh = _by_pair(new.paired)
    rows = []
    for r in ref.paired:
        n = fresh.get((r["server_config"], r["a"], r["b"], r["metric"]))
        rp, np_ = r["mean_rel_diff_pct"], (n or {}).get("mean_rel_diff_pct")
        judged = (
            _real(r["verdict"])
            and r["metric"] in s.metrics
            and rp is not None
            and abs(rp) >= s.min_effect_pct
        )
        nv = (n or {}).get("verdict")
        if _invalid(r["verdict"]):
            status, verdict = "invalid in the reference", None
        elif _invalid(nv):
            status, verdict = "invalid in the fresh run", NOT_COMPARABLE
        elif n is None or np_ is None:
            status, verdict = "missing", NOT_COMPARABLE
        elif not _real(r["verdict"]):
            status, verdict = "no difference in the reference", None
        elif nv == r["verdict"]:
            status, verdict = "preserved", REPRODUCED
        elif _real(nv):
            status, verdict = "reversed", NOT_REPRODUCED
        elif (np_ > 0) == (rp > 0):
            status = "same sign, not significant"
            verdict = NOT_REPRODUCED if s.require_significance else REPRODUCED
        else:
            status, verdict = "opposite sign, not significant", NOT_REPRODUCED
        rows.append(
            {
                "server_config": r["server_config"],
                "a": r["a"],
                "b": r["b"],
                "metric": r["metric"],
                "reference_diff_pct": rp,
                "reference_agree": r["agree"],
                "reference_verdict": r["verdict"],
                "fresh_diff_pct": np_,
                "fresh_agree": (n or {}).get("agree"),
                "fresh_verdict": nv,
                "judged": judged,
                "status": status,
                "verdict": verdict if judged else None,
            }
        )
    return rows


def _sym(v: str | None) -> str:
    return {"a > b": ">", "a < b": "<"}.get(v or "", "~")


def _chains(ref: Analysed, new: Analysed) -> list[dict[str, Any]]:
    """Adjacent levels as one line per config and metric: 'C64 < C128 > C256'."""
    out = []
    reference, fresh = _by_pair(ref.paired), _by_pair(new.paired)
    for sc in ref.g.configs:
        lv = ref.g.levels(sc)
        if len(lv) < 2:
            continue
        for m in PAIRED_METRICS:
            rs, ns = f"C{lv[0]}", f"C{lv[0]}"
            for a, b in zip(lv, lv[1:], strict=False):
                rr, nr = reference.get((sc, a, b, m)), fresh.get((sc, a, b, m))
                rs += f" {_sym((rr or {}).get('verdict'))} C{b}"
                ns += f" {_sym((nr or {}).get('verdict')) if nr else '?'} C{b}"
            out.append(
                {"server_config": sc, "metric": m, "reference": rs, "fresh": ns, "same": rs == ns}
            )
    return out


def _claims(
    ref: Analysed, new: Analysed, opts: AnalysisSection, claims: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for claim in claims:
        try:
            rc = _claim(ref, opts, claim)
        except ServelabError as exc:
            raise ServelabError(f"reference claim {claim!r}: {exc}") from None
        try:
            nc = _claim(new, opts, claim)
            fresh_verdict: str | None = nc["verdict"]
            evidence: Any = nc["evidence"]
            reason = None
        except ServelabError as exc:
            fresh_verdict, evidence, reason = None, None, str(exc)
        if fresh_verdict is None:
            verdict = NOT_COMPARABLE
        elif rc["verdict"] == "inconclusive":
            verdict, reason = NOT_COMPARABLE, "inconclusive in the reference"
        elif _invalid(rc["verdict"]):
            verdict, reason = NOT_COMPARABLE, f"invalid in the reference: {rc.get('reason')}"
        elif _invalid(fresh_verdict):
            verdict, reason = NOT_COMPARABLE, f"invalid in the fresh run: {nc.get('reason')}"
        else:
            verdict = REPRODUCED if fresh_verdict == rc["verdict"] else NOT_REPRODUCED
        rows.append(
            {
                "claim": claim,
                "reference_verdict": rc["verdict"],
                "fresh_verdict": fresh_verdict,
                "reference_evidence": rc["evidence"],
                "fresh_evidence": evidence,
                "verdict": verdict,
                "reason": reason,
            }
        )
    return rows


def reference_claims(side: Side, s: Settings) -> list[str]:
    own = list(((side.config or {}).get("analysis") or {}).get("claims") or [])
    return own + [c for c in s.extra_claims if c not in own]


def reference_options(side: Side) -> AnalysisSection:
    return analysis_section((side.config or {}).get("analysis"))


def compare_sides(ref: Side, new: Side, s: Settings) -> dict[str, Any]:
    opts = reference_options(ref)
    claims = reference_claims(ref, s)
    for claim in claims:  # syntax first: one line naming the claim
        try:
            parse_claim(claim)
        except ServelabError as exc:
            raise ServelabError(f"claims: {exc}") from None
    unknown = [m for m in (*s.metrics, *s.tolerance_metrics) if m not in POINT_METRICS]
    if unknown:
        raise ServelabError(
            f"reproduction.metrics: {unknown[0]!r} is not one of {', '.join(POINT_METRICS)}"
        )
    # both sides checked with the reference's validity thresholds (its analysis: section)
    rds = load_dataset(ref.root, validity=opts.validity)
    nds = load_dataset(new.root, validity=opts.validity)
    notes = [n for n in [_align(rds, nds)] if n]
    ra, na = _analyse(rds, opts), _analyse(nds, opts)
    host = compare_hosts(ref.provenance, new.provenance)
    prov = provenance_diff(ref, new, host)
    points = _points(ra, na, s)
    pairs = _pairs(ra, na, s)
    claim_rows = _claims(ra, na, opts, claims)
    judged = (
        [p["verdict"] for p in pairs if p["verdict"]]
        + [c["verdict"] for c in claim_rows]
        + [p["verdict"] for p in points if p["verdict"]]
    )
    if prov["blocking"]:
        overall = NOT_COMPARABLE
        why = "provenance differs: " + ", ".join(prov["blocking"])
    elif not judged:
        overall, why = NOT_COMPARABLE, "the reference has no ordering or claim to check"
    elif NOT_REPRODUCED in judged:
        overall = NOT_REPRODUCED
        why = f"{judged.count(NOT_REPRODUCED)} of {len(judged)} checks not reproduced"
    elif NOT_COMPARABLE in judged:
        overall = NOT_COMPARABLE
        why = f"{judged.count(NOT_COMPARABLE)} of {len(judged)} checks have no fresh data"
    else:
        overall, why = REPRODUCED, f"all {len(judged)} checks reproduced"
    if prov["blocking"]:
        for row in claim_rows:
            row["as_measured"] = row["verdict"]
            row["verdict"] = NOT_COMPARABLE
    host["qualifier"] = host_qualifier(host)
    for row in claim_rows:
        if row["verdict"] != NOT_COMPARABLE:
            row["host"] = _qualified(row["verdict"], host)
    return {
        "format_version": FORMAT_VERSION,
        "verdict": overall,
        "verdict_text": _qualified(overall, host),
        "why": why,
        "host": host,
        "reference": ref.describe(),
        "fresh": new.describe(),
        "settings": {
            "metrics": list(s.metrics),
            "min_effect_pct": s.min_effect_pct,
            "require_significance": s.require_significance,
            "tolerance_pct": s.tolerance_pct,
            "tolerance_metrics": list(s.tolerance_metrics),
            "threshold_pct": opts.threshold_pct,
            "alpha": opts.alpha,
        },
        "notes": notes,
        "claims": claim_rows,
        "orderings": [p for p in pairs if p["judged"]],
        "chains": _chains(ra, na),
        "paired": pairs,
        "points": points,
        "provenance": prov,
        "counts": {
            "checks": len(judged),
            "reproduced": judged.count(REPRODUCED),
            "not_reproduced": judged.count(NOT_REPRODUCED),
            "not_comparable": judged.count(NOT_COMPARABLE),
        },
    }


def _qualified(verdict: str, host: dict[str, Any]) -> str:
    """The verdict with the host it was reached on: a failure on an equivalent host is a
    regression, one on a differing host names the differences (NOT COMPARABLE stays bare)."""
    if verdict == NOT_COMPARABLE:
        return verdict
    text = f"{verdict} {host['qualifier']}"
    if verdict == NOT_REPRODUCED and host["class"] in ("equivalent", "identical"):
        text += ": a regression"
    return text


def compare(
    ref_path: Path, new_path: Path, s: Settings | None = None, out: Path | None = None
) -> dict[str, Any]:
    """Open (and verify) both sides, compare, and write reproduction.json and report.md."""
    s = s or Settings()
    with tempfile.TemporaryDirectory(prefix="servelab-compare-") as tmp:
        ref = open_side(ref_path, Path(tmp) / "reference", "reference")
        new = open_side(new_path, Path(tmp) / "fresh", "fresh run")
        result = compare_sides(ref, new, s)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "reproduction.json", result)
        validate_file(out / "reproduction.json", "reproduction", "reproduction.json")
        (out / "report.md").write_text(render(result), encoding="utf-8")
    return result


# --- the report section -------------------------------------------------------------------


def _f(x: Any, spec: str = ",.2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _signed(x: Any) -> str:
    return "-" if x is None else f"{x:+.2f}%"


def render(r: dict[str, Any]) -> str:
    ref, new = r["reference"], r["fresh"]
    lines = [
        "# Reproduction",
        "",
        f"**Verdict: {_verdict(r)}** ({r['why']}).",
        "",
        f"- Reference: `{ref['path']}` ({ref['kind']}"
        + (f", tag {ref['tag']}" if ref.get("tag") else "")
        + (f", started {ref['started']}" if ref.get("started") else "")
        + ")",
        f"- Fresh: `{new['path']}` ({new['kind']}"
        + (f", started {new['started']}" if new.get("started") else "")
        + ")",
        f"- Judged: orderings of {', '.join(r['settings']['metrics'])} the reference called "
        f"real (paired t-test on log ratios, alpha {r['settings']['alpha']}, threshold "
        f"{r['settings']['threshold_pct']}%"
        + (
            f", effect at least {r['settings']['min_effect_pct']}%"
            if r["settings"]["min_effect_pct"]
            else ""
        )
        + ("" if r["settings"]["require_significance"] else ", sign only")
        + "), every claim"
        + (
            f", and {', '.join(r['settings']['tolerance_metrics'])} within "
            f"{r['settings']['tolerance_pct']}%"
            if r["settings"]["tolerance_pct"] is not None
            else "; absolute values are reported, not judged"
        )
        + ".",
    ]
    lines += [f"- Note: {n}" for n in r["notes"]]
    lines += ["", "## Claims", ""]
    if r["claims"]:
        lines += ["| claim | reference | fresh | verdict |", "|---|---|---|---|"]
        for c in r["claims"]:
            why = f" ({c['reason']})" if c.get("reason") else ""
            lines.append(
                f"| `{c['claim']}` | {c['reference_verdict']} | "
                f"{c['fresh_verdict'] or '-'} | {_claim_verdict(c)}{why} |"
            )
    else:
        lines.append("The reference states no claims.")
    lines += ["", "## Orderings", ""]
    lines += ["Adjacent concurrency levels, `<`/`>` a real difference, `~` none:", ""]
    lines += ["| config | metric | reference | fresh |", "|---|---|---|---|"]
    for ch in r["chains"]:
        if ch["metric"] in r["settings"]["metrics"]:
            mark = "" if ch["same"] else " (differs)"
            lines.append(
                f"| {ch['server_config']} | {SHORT.get(ch['metric'], ch['metric'])} | "
                f"{ch['reference']} | {ch['fresh']}{mark} |"
            )
    lines += ["", "Judged pairs (the reference called them real):", ""]
    if r["orderings"]:
        lines += [
            "| config | pair | metric | reference | fresh | status | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for o in r["orderings"]:
            lines.append(
                f"| {o['server_config']} | C{o['a']} vs C{o['b']} | "
                f"{SHORT.get(o['metric'], o['metric'])} | {_signed(o['reference_diff_pct'])} "
                f"({o['reference_agree']}) | {_signed(o['fresh_diff_pct'])} "
                f"({o['fresh_agree'] or '-'}) | {o['status']} | {o['verdict']} |"
            )
    else:
        lines.append("None.")
    lines += ["", "## Points", "", "Means over repeats; change = fresh / reference - 1.", ""]
    lines += [
        "| config | c | metric | reference (CV) | fresh (CV) | change | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in r["points"]:
        if p["metric"] not in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
            continue
        lines.append(
            f"| {p['server_config']} | {p['concurrency']} | {SHORT[p['metric']]} | "
            f"{_f(p['reference_mean'])} ({_f(p['reference_cv_pct'], '.1f')}%) | "
            f"{_f(p['fresh_mean'])} ({_f(p['fresh_cv_pct'], '.1f')}%) | "
            f"{_signed(p['change_pct'])} | {p['status']} |"
        )
    lines += _host_section(r.get("host"))
    prov = r["provenance"]
    lines += ["", "## Provenance", ""]
    if prov["not_clean_room"]:
        lines += [f"- **{f}**" for f in prov["not_clean_room"]]
    else:
        lines.append("- Nothing that must match differs, and the fresh run is on another host.")
    diff = [f for f in prov["fields"] if not f["same"]]
    if diff:
        lines += ["", "| field | reference | fresh | effect |", "|---|---|---|---|"]
        for f in diff:
            effect = {"blocks": "not comparable", "note": "noted"}[f["effect"]]
            lines.append(
                f"| {f['field']} | {_short(f['reference'])} | {_short(f['fresh'])} | {effect} |"
            )
    return "\n".join(lines) + "\n"


def _verdict(r: dict[str, Any]) -> str:
    return str(r.get("verdict_text") or r["verdict"])


def _claim_verdict(c: dict[str, Any]) -> str:
    return str(c.get("host") or c["verdict"])


HOST_CLASS_TEXT = {
    "differs": "a performance-relevant host fact differs",
    "equivalent": "only facts that do not affect performance differ",
    "identical": "every recorded host fact is the same",
    "unknown": "no performance-relevant difference is known, but a side does not record "
    "every relevant fact",
}


def _host_section(host: dict[str, Any] | None) -> list[str]:
    if host is None:
        return []
    lines = [
        "",
        "## Host",
        "",
        f"Host class: **{host['class']}** ({HOST_CLASS_TEXT[host['class']]}); "
        "docs/reproduce.md says which facts are performance-relevant and why.",
    ]
    rows = [(d, "yes") for d in host["relevant_differences"]]
    rows += [
        (d, "no" + (f" ({d['note']})" if d.get("note") else "")) for d in host["other_differences"]
    ]
    if rows:
        lines += ["", "| fact | reference | fresh | performance-relevant |", "|---|---|---|---|"]
        for d, rel in rows:
            lines.append(
                f"| {d['fact']} | {_short(d['reference'])} | {_short(d['fresh'])} | {rel} |"
            )
    unknown = host["unknown"]
    if unknown:
        lines += ["", "Not recorded on both sides (cannot be compared):", ""]
        lines += ["| fact | not recorded by | performance-relevant |", "|---|---|---|"]
        for u in unknown:
            lines.append(
                f"| {u['fact']} | {', '.join(u['missing_in'])} | "
                f"{'yes' if u['relevant'] else 'no'} |"
            )
    return lines


def _short(v: Any) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    if len(text) > 60:
        return f"{text[:40]}... (sha256 {hashlib.sha256(text.encode()).hexdigest()[:8]})"
    return text.replace("|", "\\|")


def verdict_lines(r: dict[str, Any]) -> list[str]:
    """What `servelab compare` and the workflow print: the verdict, then one line per check
    that did not reproduce and per claim."""
    c = r["counts"]
    lines = [
        f"reproduction: {_verdict(r)} ({r['why']}; {c['reproduced']} reproduced, "
        f"{c['not_reproduced']} not reproduced, {c['not_comparable']} not comparable)"
    ]
    for cl in r["claims"]:
        lines.append(
            f"  claim {cl['claim']!r}: {_claim_verdict(cl)} (reference {cl['reference_verdict']}, "
            f"fresh {cl['fresh_verdict'] or '-'})"
        )
    for o in r["orderings"]:
        if o["verdict"] != REPRODUCED:
            lines.append(
                f"  ordering {o['server_config']} C{o['a']} vs C{o['b']} {o['metric']}: "
                f"{o['status']} (reference {_signed(o['reference_diff_pct'])}, fresh "
                f"{_signed(o['fresh_diff_pct'])})"
            )
    for p in r["points"]:
        if p["verdict"] not in (None, REPRODUCED):
            lines.append(
                f"  point {p['server_config']} c={p['concurrency']} {p['metric']}: "
                f"{p['status']} ({_signed(p['change_pct'])})"
            )
    for f in r["provenance"]["not_clean_room"]:
        lines.append(f"  provenance: {f}")
    return lines


def check_reference(path: Path) -> str:
    """Open and verify a reference (for the workflow's start); one line describing it."""
    with tempfile.TemporaryDirectory(prefix="servelab-reference-") as tmp:
        side = open_side(path, Path(tmp), "reference")
        if side.kind in ("experiment", "vllm-bench"):
            raise ServelabError(
                f"{path}: reference must be a release folder, its .tar.gz or a bundle folder "
                f"(this is {'a vllm-bench tree' if side.kind == 'vllm-bench' else 'raw results'}: "
                "compare those with `servelab compare`)"
            )
        d = side.describe()
        claims = len(reference_claims(side, Settings()))
    tag = f" tag {d['tag']}," if d.get("tag") else ""
    return f"{path} verified ({d['kind']},{tag} experiment {d.get('experiment')}, {claims} claims)"
