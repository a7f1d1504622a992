from servelab.analysis.diagnoses import diagnosis_line
from servelab.analysis.pipeline import analyze
from servelab.smk import experiment, job

with job(snakemake, "analysis") as say:
    exp, paths = experiment(snakemake)
    results = analyze(paths.root, paths.analysis, exp.analysis, figures=exp.analysis.figures)
    for d in results.diagnoses:
        say(f"diagnosis {diagnosis_line(d)}")
    for c in results.claims:
        say(f"claim {c['verdict']}: {c['claim']}")
