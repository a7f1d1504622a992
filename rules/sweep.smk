# A fixed number of repeats: one job per server configuration. The job's output is run.json,
# written last; the measured points live beside it and survive a failed job (see
# src/servelab/sweep.py).
if not isinstance(config["sweep"]["repeats"], dict):

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

# A sequential plan (sweep.repeats: {min, max}): one job measures every server configuration
# round by round until its questions are decided (src/servelab/rounds.py): the claims and,
# with a reference, the orderings a reproduction against it will judge. They decide how much
# is measured, so a changed analysis section or reference reruns it: completed points are
# kept, and only what the new questions still need is measured.
else:

    rule sweep:
        input:
            model=rules.model.output.record,
            runtime=rules.runtime.output.record,
        output:
            run=sweep_outputs(),
        params:
            config=config,
            exp=experiment_dir,
        resources:
            **measure_resources(),
        group:
            MEASURE_GROUP
        log:
            f"{EXP}/logs/sweep.log",
        benchmark:
            f"{EXP}/benchmarks/sweep.tsv"
        script:
            "../scripts/sweep.py"
