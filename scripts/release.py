from pathlib import Path

from servelab.errors import ServelabError
from servelab.evidence.release import release
from servelab.smk import job

smk = snakemake  # noqa: F821
with job(smk, "release") as say:
    if not smk.params.tag:
        raise ServelabError("release: set the tag with --config release_tag=NAME")
    evidence_root = Path(smk.output.release).parents[2]  # evidence/<experiment>/<tag>/release.json
    dest = release(
        Path(smk.input.manifest).parent,
        str(smk.params.tag),
        evidence_root,
        bool(smk.params.allow_unpinned),
    )
    say(f"released {dest}")
