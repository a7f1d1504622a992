from servelab.env.model import build_model
from servelab.env.runtime import cache_dir_of
from servelab.smk import experiment, job

with job(snakemake, "model") as say:
    exp, paths = experiment(snakemake)
    record = build_model(
        exp.model, paths.model, cache_dir_of(exp.runtime), say=say, runtime=exp.runtime
    )
    if record["revision"] is not None:  # an endpoint's model: not pinned (its own line)
        say(
            f"model: {record['source']} revision {record['revision'][:16]}, "
            f"{len(record['files'])} files"
        )
