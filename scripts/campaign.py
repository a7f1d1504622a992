from pathlib import Path

from servelab.campaign import write_campaign
from servelab.smk import job

with job(snakemake, "campaign") as say:
    experiments = [(name, Path(d)) for name, d in snakemake.params.experiments]
    md = write_campaign(snakemake.params.name, experiments, Path(snakemake.output.summary).parent)
    say(md.read_text(encoding="utf-8"))
