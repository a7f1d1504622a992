from pathlib import Path

from servelab.smk import experiment, job
from servelab.summary import render_summary

with job(snakemake, "summary") as say:
    exp, paths = experiment(snakemake)
    text = render_summary(paths.root, exp.analysis.validity)
    Path(snakemake.output.summary).write_text(text, encoding="utf-8")
    for line in text.rstrip("\n").splitlines():
        say(line)
