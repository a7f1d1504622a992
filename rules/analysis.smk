# Every table, verdict and figure is a pure function of the raw data (docs/analysis.md). Every
# file it writes under analysis/ is an output here (rules/common.smk: analysis_outputs,
# analysis_figures).


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
            report(path, caption="../docs/report-caption.rst", category="Figures")
            for path in analysis_figures("svg")
        ],
        # the same figures as PNG, written beside each SVG
        figures_png=analysis_figures("png"),
    params:
        config=EXPERIMENT_CONFIG,
        exp=experiment_dir,
    log:
        f"{EXP}/logs/analysis.log",
    benchmark:
        f"{EXP}/benchmarks/analysis.tsv"
    script:
        "../scripts/analysis.py"
