# The SLO capacity search of one server configuration (rules/search.smk).
from servelab.measure.slo_search import run_search
from servelab.smk import job, measure_job

sc = snakemake.wildcards.sc
with job(snakemake, f"search {sc}") as say:
    run_search(measure_job(snakemake, say), sc)
