from pathlib import Path

from servelab.jsonio import write_json
from servelab.runtime import ensure_runtime
from servelab.smk import experiment, job

with job(snakemake, "runtime") as say:
    exp, paths = experiment(snakemake)
    lock = getattr(snakemake.input, "lock", None)  # venv only
    record = ensure_runtime(exp.runtime, exp.profile, Path(lock) if lock else None, say)
    write_json(Path(snakemake.output.record), record)
