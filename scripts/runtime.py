from pathlib import Path

from servelab.env.runtime import ensure_runtime
from servelab.smk import experiment, job
from servelab.store.records import RuntimeRecord

with job(snakemake, "runtime") as say:
    exp, paths = experiment(snakemake)
    lock = getattr(snakemake.input, "lock", None)  # venv only
    # rule config_runtime: a configuration's own runtime (server.configs[].runtime)
    sc = getattr(snakemake.wildcards, "sc", None)
    record = ensure_runtime(
        exp.runtime_of(sc) if sc else exp.runtime,
        exp.profile,
        Path(lock) if lock else None,
        say,
        server=exp.server,
    )
    RuntimeRecord(record).write(Path(snakemake.output.record))
