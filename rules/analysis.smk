# Every table, verdict and figure is a pure function of the raw data (docs/analysis.md).


rule analysis:
    localrule: True
    input:
        runs=sweep_outputs(),
        searches=search_outputs(),
    output:
        tables=analysis_outputs(),
        report=report(
            f"{EXP}/analysis/report.md", caption="../docs/report-caption.rst", category="Report"
        ),
        figures=[
            report(
                f"{EXP}/analysis/figures/{name}.svg",
                caption="../docs/report-caption.rst",
                category="Figures",
            )
            for name in FIGURES
        ]
        if config["analysis"]["figures"]
        else [],
    params:
        config=EXPERIMENT_CONFIG,
        exp=experiment_dir,
    log:
        f"{EXP}/logs/analysis.log",
    benchmark:
        f"{EXP}/benchmarks/analysis.tsv"
    script:
        "../scripts/analysis.py"
