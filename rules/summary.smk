# The one-screen summary printed at the end of a run (src/servelab/summary.py).


rule summary:
    localrule: True
    input:
        runs=sweep_outputs(),
        # after the profiling pass and the analysis, so that the time of every stage but the
        # bundle's (which packs this summary) is known
        profile=PROFILE_OUTPUTS,
        report=f"{EXP}/analysis/report.md",
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
