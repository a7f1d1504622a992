# The profiling pass (docs/profile.md): one capture job per profiled server configuration,
# with its own server launch, serialized with the measured sweeps (measure=1) and run after the
# sweep of its configuration; then the trace analysis, which needs no measurement slot.
# A tool that cannot run gives an explicit "not profiled" record; profile.required turns that
# into a config error here, before anything starts.
import sys

from servelab.errors import ServelabError
from servelab.experiment import Experiment as _Experiment
from servelab.profile.plan import profile_plan as _profile_plan

try:
    PROFILE_PLAN = _profile_plan(_Experiment.from_dict(config))
except ServelabError as _exc:
    sys.exit(f"config error: {_exc}")
PROFILE_OUTPUTS = expand(f"{EXP}/profile/{{sc}}/profile.json", sc=list(PROFILE_PLAN))


rule profile:
    input:
        model=rules.model.output.record,
        runtime=rules.runtime.output.record,
        run=f"{EXP}/raw/{{sc}}/run.json",
    output:
        capture=f"{EXP}/profile/{{sc}}/capture.json",
    params:
        config=MEASURE_CONFIG,
        exp=experiment_dir,
    resources:
        **measure_resources(),
    group:
        MEASURE_GROUP
    log:
        f"{EXP}/logs/profile-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/profile-{{sc}}.tsv"
    script:
        "../scripts/profile.py"


rule profile_report:
    localrule: True
    input:
        capture=rules.profile.output.capture,
        model=rules.model.output.record,
    output:
        profile=f"{EXP}/profile/{{sc}}/profile.json",
        report=report(f"{EXP}/profile/{{sc}}/profile.md", category="Profile"),
    params:
        config=MEASURE_CONFIG,
        exp=experiment_dir,
    log:
        f"{EXP}/logs/profile-report-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/profile-report-{{sc}}.tsv"
    script:
        "../scripts/profile_report.py"
