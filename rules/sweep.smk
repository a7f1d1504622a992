# A fixed number of repeats: one job per server configuration. The job's output is run.json,
# written last; the measured points live beside it and survive a failed job (see
# src/servelab/measure/sweep.py).
# A sequential plan (SEQUENTIAL, sweep.repeats: {min, max}): one job measures every server
# configuration round by round until its questions are decided (src/servelab/measure/sequential.py): the
# claims and, with a reference, the orderings a reproduction against it will judge. They decide
# how much is measured, so its params are the whole config: a changed analysis section or
# reference reruns it, completed points are kept, and only what the new questions still need
# is measured.
# A configuration profiled on the sweep's own launch (PROFILE_ON_SWEEP, profile.launch; the
# CPU torch profiler by default) is measured by sweep_profile instead: the same job, with the
# profiler configured and idle until the last point, then the profiling pass's diagnostic
# points on the same server, so it writes the capture (docs/profile.md, "Which launch").
rule sweep:
    input:
        model=rules.model.output.record,
        runtime=rules.runtime.output.record,
        config_runtimes=config_runtimes,
        clients=client_tools_record,
    output:
        run=sweep_outputs() if SEQUENTIAL else f"{EXP}/raw/{{sc}}/{_paths.RUN_FILE}",
    params:
        config=config if SEQUENTIAL else MEASURE_CONFIG,
        exp=experiment_dir,
    resources:
        **measure_resources(),
    group:
        MEASURE_GROUP
    wildcard_constraints:
        sc=one_of([sc for sc in SERVER_CONFIGS if sc not in PROFILE_ON_SWEEP]),
    log:
        f"{EXP}/logs/sweep.log" if SEQUENTIAL else f"{EXP}/logs/sweep-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/sweep.tsv" if SEQUENTIAL else f"{EXP}/benchmarks/sweep-{{sc}}.tsv"
    script:
        "../scripts/sweep.py"


rule sweep_profile:
    input:
        model=rules.model.output.record,
        runtime=rules.runtime.output.record,
        config_runtimes=config_runtimes,
        clients=client_tools_record,
    output:
        run=f"{EXP}/raw/{{sc}}/{_paths.RUN_FILE}",
        capture=f"{EXP}/profile/{{sc}}/{_paths.CAPTURE_FILE}",
    params:
        config=MEASURE_CONFIG,
        exp=experiment_dir,
    resources:
        **measure_resources(),
    group:
        MEASURE_GROUP
    wildcard_constraints:
        sc=one_of(PROFILE_ON_SWEEP),
    log:
        f"{EXP}/logs/sweep-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/sweep-{{sc}}.tsv"
    script:
        "../scripts/sweep.py"
