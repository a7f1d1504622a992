"""From diagnosis to measured fix: the confirmation experiment a diagnosing experiment's
proposals call for (`snakemake --cores all confirm`, rules/confirm.smk; docs/analysis.md,
"Proposals and confirmation").

plan_confirmation() reads the proposals in diagnoses.json (analysis.proposals) and derives one
experiment: the diagnosed configuration and each proposed one side by side, the same model,
runtime and workload, at the concurrencies the proposals' claims judge, with the original's
repeats (or sequential plan), the proposals' claims as its claims, and `analysis.confirms`
naming the diagnosing experiment, its bundle by digest and the proposals. A proposal that
cannot be tried (an operating point, a change the runtime does not have, over
confirm.max_proposals) is listed with the reason, not run. The analysis of the confirmation
judges each proposal (analysis.confirmation)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NotRequired, TypedDict

from servelab.analysis.diagnosis_records import Change
from servelab.analysis.proposals import change_words, proposal_line
from servelab.config import validate
from servelab.documents import JsonObject
from servelab.documents.declared import Diagnosis, Proposal
from servelab.errors import ServelabError
from servelab.experiment import ArgValue, Experiment
from servelab.store.hashing import sha256_file

CONFIRM_SUFFIX = "-confirm"  # the confirmation of experiment X is experiment X-confirm
DEFAULT_MAX_PROPOSALS = 2  # confirm.max_proposals when the config has no confirm section
CONFIRM_RECORD = "confirm.json"  # what the confirm rule writes in the confirmation's folder
CONFIRM_CONFIG = "config.yaml"  # the derived experiment, beside it


class Tried(TypedDict):
    """A proposal a confirmation measures (analysis.confirms.proposals)."""

    id: str
    diagnoses: list[str]
    server_config: str
    config: str
    change: Change
    concurrency: list[int]
    claims: list[str]
    expected: str
    why: str


class NotTried(TypedDict):
    """A proposal a confirmation does not measure, and why (analysis.confirms.not_tried)."""

    diagnoses: list[str]
    server_config: str
    proposal: str
    reason: str


class ConfirmRecord(TypedDict):
    """What confirm.json records (besides the run's status): the diagnosing experiment, its
    bundle, the proposals tried and not, and the confirmation's experiment file and name."""

    experiment: str
    bundle: str
    tried: list[Tried]
    not_tried: list[NotTried]
    config: NotRequired[str]
    confirmation: NotRequired[str]


@dataclass(frozen=True)
class Plan:
    """A confirmation: the derived experiment's resolved config (None when no proposal can
    be measured), the proposals it measures (analysis.confirms.proposals) and those it does
    not, each with the reason."""

    config: JsonObject | None
    tried: list[Tried]
    not_tried: list[NotTried]

    def lines(self) -> list[str]:
        """The plan in words, as the confirm rule prints it."""
        out = []
        for p in self.tried:
            change = change_words(p["change"])
            out.append(
                f"{p['id']}: {change} on {p['server_config']} (from {', '.join(p['diagnoses'])}); "
                f"expected: {p['expected']}"
            )
        for n in self.not_tried:
            out.append(
                f"not tried: {n['proposal']} on {n['server_config']} "
                f"(from {', '.join(n['diagnoses'])}): {n['reason']}"
            )
        return out


def _grouped(diagnoses: Sequence[Diagnosis]) -> list[tuple[list[str], Proposal]]:
    """The distinct proposals in the order diagnoses.json lists them, each with the kinds of
    the diagnoses that made it (serialized and kv_headroom_unused propose the same change)."""
    found: dict[str, tuple[list[str], Proposal]] = {}
    for d in diagnoses:
        p = d.get("proposal")
        if p is None:
            continue
        key = json.dumps([p["server_config"], p.get("change"), p.get("operate_at")], sort_keys=True)
        if key not in found:
            found[key] = ([], p.copy())
        kinds = found[key][0]
        if d["kind"] not in kinds:
            kinds.append(d["kind"])
    return list(found.values())


def _words(p: Proposal) -> str:
    if "change" in p:
        return change_words(p["change"])
    axis, at = next(iter(p["operate_at"].items()))
    return f"operate at {'request rate' if axis == 'rate' else axis} {at:g}"


class ServerConfigEntry(TypedDict):
    """A server configuration of the derived experiment (server.configs[])."""

    name: str
    args: dict[str, ArgValue]


def _section(cfg: Mapping[str, object], key: str) -> dict[str, object]:
    """A section of a resolved config (an object: the schema says so), to set keys of."""
    section = cfg[key]
    if not isinstance(section, dict):
        raise TypeError(f"config {key}: expected a mapping, got {section!r}")
    return section


def _merged_args(base: Mapping[str, ArgValue], change: Change) -> dict[str, ArgValue]:
    """The diagnosed configuration's arguments with the change: a compilation config is merged
    key by key into one the configuration already gives."""
    out = dict(base)
    for k, v in change.items():
        given = out.get(k)
        if k == "compilation-config" and isinstance(given, str):
            try:
                merged = {**json.loads(given), **json.loads(str(v))}
            except json.JSONDecodeError:
                merged = json.loads(str(v))
            out[k] = json.dumps(merged, separators=(",", ":"))
        else:
            out[k] = v
    return out


def _why_not(
    p: Proposal, exp: Experiment, configs: Mapping[str, Mapping[str, ArgValue]]
) -> str | None:
    """Why a proposal cannot be measured by a confirmation of this experiment, or None."""
    if not p.get("tryable"):
        return str(p.get("not_tried") or "the proposal says it cannot be tried")
    if p["server_config"] not in configs:
        return f"{p['server_config']!r} is not a server configuration of this experiment"
    if exp.sweep.rate is not None:
        return "a sweep over request rates: a confirmation measures a concurrency sweep"
    change = p["change"]
    if "compilation-config" in change and exp.runtime.device != "gpu":
        return (
            f"CUDA graph capture sizes need a GPU runtime (runtime.device is {exp.runtime.device})"
        )
    args = {**exp.server.args, **configs[p["server_config"]]}
    if all(args.get(k) == v for k, v in change.items()):
        return f"{p['server_config']} already runs with {_words(p)}"
    return None


def plan_confirmation(
    config: JsonObject,
    diagnoses: Sequence[Diagnosis],
    bundle: Path,
    max_proposals: int | None = None,
) -> Plan:
    """The confirmation of the experiment `config` (its resolved config) from its
    diagnoses.json and its bundle folder (named by the sha256 of its manifest.json)."""
    exp = Experiment.from_dict(config)
    if exp.reference or exp.analysis.confirms:
        what = "a reproduction" if exp.reference else "a confirmation"
        raise ServelabError(
            f"{exp.experiment}: confirm: this experiment is {what}; confirm the "
            "experiment it was made from"
        )
    given = exp.confirm.max_proposals if exp.confirm is not None else DEFAULT_MAX_PROPOSALS
    limit = max_proposals or given
    configs = {c.name: dict(c.args) for c in exp.server.configs}
    tried: list[Tried] = []
    not_tried: list[NotTried] = []
    for kinds, p in _grouped(diagnoses):
        reason = _why_not(p, exp, configs)
        if reason is None and len(tried) >= limit:
            reason = f"over confirm.max_proposals ({limit}): confirm it in a later run"
        if reason is not None:
            not_tried.append(
                {
                    "diagnoses": kinds,
                    "server_config": p["server_config"],
                    "proposal": _words(p),
                    "reason": reason,
                }
            )
            continue
        tried.append(
            {
                "id": f"P{len(tried) + 1}",
                "diagnoses": kinds,
                "server_config": p["server_config"],
                "config": p["config"],
                "change": dict(p["change"]),
                "concurrency": list(p["concurrency"]),
                "claims": list(p["claims"]),
                "expected": p["expected"],
                "why": p["why"],
            }
        )
    if not tried:
        return Plan(None, tried, not_tried)
    manifest = bundle / "manifest.json"
    if not manifest.is_file():
        raise ServelabError(f"{manifest}: not found; build the experiment's bundle first")
    derived = _derive(config, tried, not_tried, bundle, sha256_file(manifest), configs)
    return Plan(derived, tried, not_tried)


def _derive(
    config: JsonObject,
    tried: list[Tried],
    not_tried: list[NotTried],
    bundle: Path,
    manifest_sha256: str,
    configs: Mapping[str, Mapping[str, ArgValue]],
) -> JsonObject:
    """The confirmation experiment's config, validated: the original's with the diagnosed and
    proposed configurations, the judged concurrencies, the proposals' claims and
    analysis.confirms; no profiling pass, search, reference or confirm section."""
    cfg: dict[str, object] = copy.deepcopy(dict(config))
    cfg["experiment"] = f"{config['experiment']}{CONFIRM_SUFFIX}"
    server_configs: list[ServerConfigEntry] = []
    for p in tried:
        if p["server_config"] not in [c["name"] for c in server_configs]:
            server_configs.append(
                {"name": p["server_config"], "args": dict(configs[p["server_config"]])}
            )
        server_configs.append(
            {"name": p["config"], "args": _merged_args(configs[p["server_config"]], p["change"])}
        )
    _section(cfg, "server")["configs"] = server_configs
    _section(cfg, "sweep")["concurrency"] = sorted({c for p in tried for c in p["concurrency"]})
    analysis = _section(cfg, "analysis")
    analysis["claims"] = [c for p in tried for c in p["claims"]]
    analysis["pairs"] = []  # they name the original's configurations and levels
    analysis["confirms"] = {
        "experiment": config["experiment"],
        "bundle": str(bundle),
        "manifest_sha256": manifest_sha256,
        "proposals": tried,
        "not_tried": not_tried,
    }
    _section(cfg, "profile")["enabled"] = False
    if cfg.get("search"):
        _section(cfg, "search")["enabled"] = False
    cfg["reference"] = None
    cfg.pop("confirm", None)
    source = f"the confirmation of {config['experiment']}"
    return validate(cfg, source=source).to_dict()


def plan_lines(diagnoses: Sequence[Diagnosis]) -> list[str]:
    """Each diagnosis's proposal in one line (a dry run: nothing derived, nothing measured)."""
    out = []
    for d in diagnoses:
        line = proposal_line(d)
        if line is not None:
            out.append(f"{d['kind']} ({d['server_config']}): {line}")
    return out


def write_config(plan: Plan, path: Path) -> None:
    """The derived experiment as an experiment file (it runs by hand too:
    snakemake --cores all --configfile PATH)."""
    import yaml

    assert plan.config is not None
    conf = _section(_section(plan.config, "analysis"), "confirms")
    head = [
        f"# The confirmation of {conf['experiment']}: written by `snakemake --cores all confirm`",
        f"# from its diagnoses (bundle {conf['bundle']}, manifest sha256",
        f"# {conf['manifest_sha256']}). Rerun by hand with",
        f"#   snakemake --cores all --configfile {path}",
        *[f"# {line}" for line in plan.lines()],
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(plan.config, sort_keys=False, allow_unicode=True)
    path.write_text("\n".join(head) + "\n" + body, encoding="utf-8")


def seed_reused(diagnosing: Path, confirmation: Path) -> list[str]:
    """The diagnosing experiment's model and runtime records copied into the confirmation's
    folder, times kept, so that its workflow finds them made and builds nothing again; a
    model built into the diagnosing folder (tiny) is served from there, so the server loads the
    same path and reuses what earlier starts compiled (the compile cache is keyed on it).
    Folders the confirmation already has are left as they are. Returns the folders seeded."""
    import shutil

    from servelab.env.model import model_dir
    from servelab.store.jsonio import read_json, write_json

    seeded = []
    for name in ("model", "runtime"):
        src, dst = diagnosing / name, confirmation / name
        if not src.is_dir() or dst.exists():
            continue
        dst.mkdir(parents=True)
        for record in sorted(src.glob("*.json")):
            data = read_json(record)
            if name == "model":
                data["path"] = str(model_dir(record))
            write_json(dst / record.name, data)
            shutil.copystat(record, dst / record.name)
        seeded.append(name)
    return seeded


def _run_workflow(cmd: list[str], log: Path, say: Callable[[str], None]) -> int:
    """Run the confirmation's workflow, its output streamed to `say` and kept in `log`; a
    SIGTERM to this job (its own workflow gone, or killed) stops it as Snakemake stops."""
    import signal
    import subprocess

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )

        def stop(signum: int, frame: FrameType | None) -> None:
            proc.send_signal(signal.SIGTERM)

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                say(f"  | {line.rstrip()}")
            return proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class Workflow:
    """How the confirm rule runs the confirmation: `command` (the experiment file is added
    after it) under Snakemake's `executor` (by name: local, or a cluster's)."""

    command: list[str]
    executor: str = "local"


def workflow_command(snakefile: Path, cores: int, executor: str = "local") -> Workflow:
    """This workflow with this many cores, under the outer run's executor."""
    import sys

    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--cores", str(cores)]
    return Workflow(cmd, executor)


LOCAL_EXECUTORS = ("local",)


def check_executor(executor: str, cfg_path: Path) -> None:
    """The confirmation runs its workflow nested, on the host that runs the confirm rule (a
    local rule). Under a cluster executor that host is the one submitting, not a node: refuse,
    rather than measure there."""
    if executor not in LOCAL_EXECUTORS:
        raise ServelabError(
            f"{cfg_path}: written, not measured: confirm runs the confirmation on the host "
            f"that runs the confirm rule, which under the {executor} executor is the "
            "submitting host, not a node; on a node held for it, run `snakemake --cores all "
            'confirm` with the same --configfile (docs/cluster.md, "Confirming a diagnosis")'
        )


def run_confirm(
    config: JsonObject,
    diagnoses: Path,
    bundle: Path,
    record: Path,
    workflow: Workflow,
    say: Callable[[str], None] = print,
) -> ConfirmRecord:
    """The confirm rule: plan the confirmation, write its experiment file beside `record`,
    seed its model and runtime from the diagnosing experiment's, run it with `workflow`
    (workflow_command) and write `record` (confirm.json): the plan, the run's status and the
    verdicts of its analysis/confirmation.json. A run that fails keeps what it measured and
    raises after writing the record. Under a cluster executor (`workflow.executor`) it
    writes the experiment file and raises before measuring anything (check_executor)."""
    from servelab.store.jsonio import read_json, write_json

    plan = plan_confirmation(config, read_json(diagnoses), bundle)
    folder = record.parent
    out: ConfirmRecord = {
        "experiment": str(config["experiment"]),
        "bundle": str(bundle),
        "tried": plan.tried,
        "not_tried": plan.not_tried,
    }
    for line in plan.lines():
        say(f"confirm: {line}")
    if plan.config is None:
        say("confirm: no proposal can be measured: nothing to run")
        write_json(record, {**out, "status": "nothing to measure"})
        return out
    cfg_path = folder / CONFIRM_CONFIG
    write_config(plan, cfg_path)
    check_executor(workflow.executor, cfg_path)
    seeded = seed_reused(bundle.parent, folder)
    if seeded:
        say(f"confirm: reusing the {' and '.join(seeded)} of {bundle.parent}")
    cmd = [*workflow.command, "--configfile", str(cfg_path)]
    say(f"confirm: running {plan.config['experiment']}: {' '.join(cmd[2:])}")
    rc = _run_workflow(cmd, folder / "logs" / "confirm-workflow.log", say)
    out["config"] = str(cfg_path)
    out["confirmation"] = str(plan.config["experiment"])
    table = folder / "analysis" / "confirmation.json"
    if rc != 0 or not table.is_file():
        write_json(record, {**out, "status": "failed", "exit_status": rc})
        raise ServelabError(
            f"{cfg_path}: the confirmation's workflow exited with {rc}; what it measured is "
            f"kept in {folder} (log: {folder / 'logs' / 'confirm-workflow.log'}); rerun "
            "`snakemake --cores all confirm` to resume it"
        )
    from servelab.analysis.confirmation import verdict_line

    verdicts = read_json(table)["proposals"]
    for p in verdicts:
        say(f"confirm: {verdict_line(p)}")
    say(f"confirm: details in {folder / 'analysis' / 'report.md'}")
    write_json(record, {**out, "status": "measured", "verdicts": verdicts})
    return out
