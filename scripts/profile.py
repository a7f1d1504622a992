from servelab.profile.capture import run_profile
from servelab.smk import job, measure_job

with job(snakemake, f"profile {snakemake.wildcards.sc}") as say:
    run_profile(measure_job(snakemake, say), snakemake.wildcards.sc)
