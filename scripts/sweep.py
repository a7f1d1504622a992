from pathlib import Path

from servelab.measure.sequential import run_rounds
from servelab.measure.sweep import run_sweep
from servelab.reproduce import reference_orderings
from servelab.smk import job, measure_job

# one server configuration (a fixed number of repeats), or all of them round by round (a
# sequential plan: rules/sweep.smk)
sc = getattr(snakemake.wildcards, "sc", None)
with job(snakemake, f"sweep {sc}" if sc else "sequential sweep") as say:
    measuring = measure_job(snakemake, say)
    exp = measuring.exp
    if sc is None:  # the orderings a reproduction against the reference will judge
        ref = exp.reference
        asked = [] if ref is None else reference_orderings(Path(ref), exp.reproduction)
        run_rounds(measuring, reference_orderings=asked)
    else:
        run_sweep(measuring, sc)
