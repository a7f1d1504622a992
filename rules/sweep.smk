# One job per server configuration. The job's output is run.json, written last; the measured
# points live beside it and survive a failed job (see src/servelab/sweep.py).
rule sweep:
    input:
        model=rules.model.output.record,
        runtime=rules.runtime.output.record,
    output:
        run=f"{EXP}/raw/{{sc}}/run.json",
    params:
        config=MEASURE_CONFIG,
        exp=experiment_dir,
    resources:
        **measure_resources(),
    group:
        MEASURE_GROUP
    log:
        f"{EXP}/logs/sweep-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/sweep-{{sc}}.tsv"
    script:
        "../scripts/sweep.py"
