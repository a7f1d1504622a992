from pathlib import Path

from servelab.errors import ServelabError
from servelab.evidence.release import release
from servelab.smk import experiment, job

with job(snakemake, "release") as say:
    _, paths = experiment(snakemake)
    tag = snakemake.params.tag
    if not tag:
        raise ServelabError("release: set the tag with --config release_tag=NAME")
    evidence = Path(snakemake.params.evidence)
    dest = release(paths.bundle, str(tag), evidence, bool(snakemake.params.allow_unpinned))
    say(f"released {dest}")
