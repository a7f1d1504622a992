from pathlib import Path

from servelab.analysis.validity import Thresholds
from servelab.smk import job
from servelab.summary import render_summary

with job(snakemake, "summary") as say:  # noqa: F821
    validity = Thresholds.from_config(snakemake.config["analysis"]["validity"])  # noqa: F821
    text = render_summary(Path(snakemake.output.summary).parent, validity)  # noqa: F821
    Path(snakemake.output.summary).write_text(text, encoding="utf-8")  # noqa: F821
    for line in text.rstrip("\n").splitlines():
        say(line)
