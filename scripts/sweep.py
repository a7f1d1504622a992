from pathlib import Path

from servelab.jsonio import read_json
from servelab.model import model_dir
from servelab.rounds import run_rounds
from servelab.smk import experiment, job
from servelab.sweep import run_sweep

# one server configuration (a fixed number of repeats), or all of them round by round (a
# sequential plan: rules/sweep.smk)
sc = getattr(snakemake.wildcards, "sc", None)
with job(snakemake, f"sweep {sc}" if sc else "sequential sweep") as say:
    exp, paths = experiment(snakemake)
    where = {
        "model_dir": model_dir(Path(snakemake.input.model)),
        "runtime": read_json(Path(snakemake.input.runtime)),
        "say": say,
    }
    if sc is None:
        run_rounds(exp, paths, **where)
    else:
        run_sweep(exp, paths, sc, **where)
