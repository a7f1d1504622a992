# The profiling pass (docs/profile.md): one capture job per profiled server configuration
# with a server launch of its own, serialized with the measured sweeps (measure=1) and run
# after the sweep of its configuration (one profiled on the sweep's launch, PROFILE_ON_SWEEP, is
# captured by rules/sweep.smk's sweep_profile); then the trace analysis, which needs no
# measurement slot.
PROFILE_OUTPUTS = expand(
    f"{EXP}/profile/{{sc}}/{_paths.PROFILE_FILE}", sc=list(PROFILE_PLAN)
)


rule profile:
    input:
        model=rules.model.output.record,
        runtime=rules.runtime.output.record,
        config_runtimes=config_runtimes,
        run=f"{EXP}/raw/{{sc}}/{_paths.RUN_FILE}",
    output:
        capture=f"{EXP}/profile/{{sc}}/{_paths.CAPTURE_FILE}",
    wildcard_constraints:
        sc=one_of([sc for sc in PROFILE_PLAN if sc not in PROFILE_ON_SWEEP]),
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
        capture=f"{EXP}/profile/{{sc}}/{_paths.CAPTURE_FILE}",
        model=rules.model.output.record,
    output:
        profile=f"{EXP}/profile/{{sc}}/{_paths.PROFILE_FILE}",
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
