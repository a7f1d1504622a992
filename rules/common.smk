# Validate the config (schema defaults filled in), name the experiment folder, input functions.
import os
import re
import sys

from servelab.config import read_sources as _read_sources
from servelab.config import validate as _validate
from servelab.workload.datasets import check_local_pin as _check_local_pin
from servelab.workload.trace import check_local_pin as _check_trace_pin
from servelab.store import paths as _paths
from servelab.errors import ServelabError
from servelab.experiment import Experiment as _Experiment
from servelab.profile.plan import on_sweep_launch as _on_sweep_launch
from servelab.profile.plan import profile_plan as _profile_plan
from servelab.analysis.tails import tail_notes as _tail_notes

_sources = [str(p) for p in (workflow.overwrite_configfiles or ["config/config.yaml"])]
# An experiment file (--configfile) replaces the default experiment instead of extending it:
# keys it leaves out take the schema's defaults, never config/config.yaml's values (Snakemake
# would merge them in, e.g. the CPU quickstart's server.args into a GPU experiment), unless it
# says `extends: ../config.yaml` (docs/config.md, "Overlays"): servelab reads each file as
# servelab.config.read_file does, with --config's values over them.
try:
    _raw = dict(config)
    if workflow.overwrite_configfiles:
        _raw = _read_sources(workflow.overwrite_configfiles, workflow.config_settings.config)
except ServelabError as _exc:
    sys.exit(f"config error: {_exc}")
# Options of the `release` target (--config release_tag=TAG [release_allow_unpinned=true]) are
# not part of the experiment.
RELEASE_TAG = _raw.pop("release_tag", None)
RELEASE_ALLOW_UNPINNED = _raw.pop("release_allow_unpinned", False)
try:
    _resolved = _validate(_raw, source=", ".join(_sources)).to_dict()
except ServelabError as _exc:
    sys.exit(f"config error: {_exc}")
config.clear()
config.update(_resolved)

EXP = f"{config['results_dir']}/{config['experiment']}"
# The measuring jobs (runtime probe, sweeps, SLO capacity searches, profiling pass): under a
# cluster executor one job group, submitted as one job, so that every configuration is measured
# on the same node (docs/cluster.md); every other rule is a localrule, run where snakemake was
# started.
MEASURE_GROUP = f"measure-{config['experiment']}"

# A reference to reproduce is verified before anything is measured.
REPRODUCTION = []
if config["reference"]:
    from pathlib import Path as _Path

    from servelab.reproduce import check_reference as _check_reference

    try:
        _ref = _check_reference(_Path(config["reference"]), config["workload"])
    except ServelabError as _exc:
        sys.exit(f"reference error: {_exc}")
    print(f"reference: {_ref}", file=sys.stderr)
    REPRODUCTION = [f"{EXP}/reproduction/reproduction.json"]
SERVER_CONFIGS = [c["name"] for c in config["server"]["configs"]]
# The profiling pass's plan (servelab.profile.plan): which configurations are profiled, with
# which tool, and which of them on the sweep's own launch (profile.launch). A tool that cannot
# run gives an explicit "not profiled" record; profile.required turns that into a config error
# here, before anything starts.
try:
    _EXPERIMENT = _Experiment.from_dict(config)
    PROFILE_PLAN = _profile_plan(_EXPERIMENT)
    PROFILE_ON_SWEEP = _on_sweep_launch(_EXPERIMENT, PROFILE_PLAN)
    # a dataset named by path is checked against its sha256 before anything starts
    _check_local_pin(_EXPERIMENT.workload.dataset)
    _check_trace_pin(_EXPERIMENT.workload.trace)  # and a trace named by path
    # a claim on a percentile the points will hold too few requests to report
    for _note in _tail_notes(_EXPERIMENT):
        print(_note, file=sys.stderr)
except ServelabError as _exc:
    sys.exit(f"config error: {_exc}")
# sweep.repeats a sequential plan ({min, max}): one sweep job for every configuration, round by
# round (rules/sweep.smk), and its looks among the analysis outputs
SEQUENTIAL = isinstance(config["sweep"]["repeats"], dict)
# What the measuring and analysing rules see: setting a reference afterwards compares an
# existing run without measuring it again.
EXPERIMENT_CONFIG = {k: v for k, v in config.items() if k not in ("reference", "reproduction")}
# What the measuring rules see: a new claim or SLO re-runs the analysis, not the measurements.
MEASURE_CONFIG = {k: v for k, v in EXPERIMENT_CONFIG.items() if k != "analysis"}


def experiment_dir(wildcards, input, output):
    """Every rule's params.exp: the experiment folder, read off the rule's own files (the first
    output or input under EXP) rather than written as a constant, so that an executor which
    maps files to another place (remote storage) maps this folder with them."""
    for path in map(str, [*output, *input]):
        at = path.rfind(f"{EXP}/")
        if at >= 0:
            return path[: at + len(EXP)]
    raise ValueError(f"no input or output of this rule is under {EXP}/")


wildcard_constraints:
    sc="|".join(SERVER_CONFIGS),


# One measurement at a time on a host, whatever the invocation says: two servers measured side
# by side on the same cores would measure each other. A job group running on a cluster node
# (profiles/slurm) is executed by a snakemake started there without --resources: this default is
# what keeps its measuring jobs in sequence.
workflow.global_resources.setdefault("measure", 1)


def node_cpus(wildcards):
    """CPUs a measuring job asks of a cluster's job step: every CPU of the node's allocation
    (SLURM_CPUS_ON_NODE, inside the job), so that the server sees the node as a local run sees
    its host; 1 where the job is submitted (the allocation is whole: --exclusive) and locally,
    where it means nothing."""
    return int(os.environ.get("SLURM_CPUS_ON_NODE", "1"))


# what a measuring job asks of a cluster besides CPUs and GPUs: the whole node (nothing else may
# run beside a measurement); ignored by a local run
WHOLE_NODE = {"slurm_extra": "'--exclusive'"}


def confirm_cores(wildcards):
    """The cores the inner run gets: this run's --cores, read when the rule runs (a cluster
    profile gives no --cores, and reading workflow.cores at parse time fails the workflow).
    Snakemake 9 keeps global resources as Resource objects; older releases as plain ints."""
    cores = workflow.global_resources.get("_cores")
    cores = getattr(cores, "value", cores)
    return int(cores) if isinstance(cores, int) and cores > 0 else 1


def measure_resources():
    """Resources of the measuring jobs: the measurement slot, the whole node and every CPU of
    it, the GPUs."""
    return {"measure": 1, "cpus_per_task": node_cpus, **WHOLE_NODE, **gpu_resources()}


def gpu_resources():
    """GPU jobs declare their GPUs so a cluster executor can place them."""
    rt = config["runtime"]
    return {"gpu": rt["gpus"]} if rt["device"] == "gpu" and rt["gpus"] > 0 else {}


def model_params():
    """The model rule's params: the model section; for the model a running server serves
    (runtime.kind endpoint), with the URL it is served at, so that another server reruns it."""
    rt = config["runtime"]
    if rt["kind"] != "endpoint":
        return config["model"]
    return {**config["model"], "url": rt["url"]}


# client.cross_check: other benchmark tools measuring the sweep's points (rules/runtime.smk,
# client_tools: their venvs from envs/<tool>.lock; servelab.measure.crosscheck)
CROSS_CHECK = list(_EXPERIMENT.cross_check)


def client_tools_record(wildcards):
    """runtime/clients.json where client.cross_check names tools: the sweeps read it."""
    return [f"{EXP}/runtime/{_paths.CLIENTS_FILE}"] if CROSS_CHECK else []


def runtime_inputs(wildcards):
    """The lock of a venv runtime; a container runtime reads nothing from the repository."""
    rt = config["runtime"]
    return {"lock": rt["lock"]} if rt["kind"] == "venv" else {}


# the configurations with a runtime of their own (server.configs[].runtime; rules/runtime.smk)
OWN_RUNTIME = _EXPERIMENT.server.own_runtime


def config_runtimes(wildcards):
    """The runtime records of the configurations with their own runtime that a measuring job
    serves: its configuration's, or every one for the sequential plan's single job."""
    sc = getattr(wildcards, "sc", None)
    names = [n for n in OWN_RUNTIME if sc is None or n == sc]
    return [f"{EXP}/runtime/{n}/{_paths.RUNTIME_FILE}" for n in names]


def config_runtime_inputs(wildcards):
    """The lock of a configuration's own venv runtime; an image reads nothing from the
    repository."""
    own = _EXPERIMENT.server.config(wildcards.sc).runtime
    return {"lock": own.lock} if own.lock is not None else {}


def one_of(names):
    """A rule's wildcard constraint that matches exactly `names` (none: never matches)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def sweep_outputs(wildcards=None):
    return expand(f"{EXP}/raw/{{sc}}/{_paths.RUN_FILE}", sc=SERVER_CONFIGS)


# the configurations the SLO capacity search measures (search.enabled; rules/search.smk)
SEARCHED = _EXPERIMENT.searched


def search_outputs(wildcards=None):
    out = f"{EXP}/raw/{{sc}}/{_paths.SEARCH_DIR}/{_paths.SEARCH_FILE}"
    return expand(out, sc=SEARCHED)


# analysis outputs (rules/analysis.smk), named once in servelab.store.paths: every file the analysis
# writes is one of the rule's outputs, as tests/test_analysis_outputs.py checks. Figures are the
# analysis figures, utilization against tokens/s (telemetry), each searched configuration's
# search path; each as SVG and as PNG (servelab.render.FIGURE_FORMATS).
FIGURES = _paths.figure_names(config["telemetry"]["enabled"], SEARCHED)


def analysis_outputs():
    """The analysis' tables and verdicts: ANALYSIS_TABLES and validity.json always, the others
    where they apply."""
    out = [f"{EXP}/analysis/{name}" for name in (*_paths.ANALYSIS_TABLES, _paths.VALIDITY_TABLE)]
    if any(v is not None for v in config["analysis"]["slo"].values()):
        out.append(f"{EXP}/analysis/{_paths.SLO_TABLE}")
    if SEQUENTIAL:
        out.append(f"{EXP}/analysis/{_paths.ROUNDS_TABLE}")
    if config["workload"].get("chat"):
        out.append(f"{EXP}/analysis/{_paths.TURNS_TABLE}")
    if config["analysis"].get("confirms"):
        out.append(f"{EXP}/analysis/{_paths.CONFIRMATION_TABLE}")
    if config["analysis"].get("compare"):
        out.append(f"{EXP}/analysis/{_paths.SAME_HOST_TABLE}")
    return out


def analysis_figures(fmt):
    """The analysis figures in format `fmt` (svg, png), where analysis.figures draws them."""
    if not config["analysis"]["figures"]:
        return []
    return [f"{EXP}/analysis/figures/{name}.{fmt}" for name in FIGURES]
