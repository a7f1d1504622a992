# The one-screen summary printed at the end of a run (src/servelab/summary.py).


rule summary:
    localrule: True
    input:
        runs=sweep_outputs(),
        # after the profiling pass, so that the time of every measuring stage is known
        profile=PROFILE_OUTPUTS,
    output:
        summary=f"{EXP}/summary.txt",
    params:
        exp=experiment_dir,
    log:
        f"{EXP}/logs/summary.log",
    benchmark:
        f"{EXP}/benchmarks/summary.tsv"
    script:
        "../scripts/summary.py"
