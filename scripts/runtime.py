from pathlib import Path

from servelab.env.runtime import ensure_runtime
from servelab.smk import experiment, job
from servelab.store.records import RuntimeRecord

with job(snakemake, "runtime") as say:
    exp, paths = experiment(snakemake)
    lock = getattr(snakemake.input, "lock", None)  # venv only
    record = ensure_runtime(
        exp.runtime, exp.profile, Path(lock) if lock else None, say, server=exp.server
    )
    RuntimeRecord(record).write(Path(snakemake.output.record))
