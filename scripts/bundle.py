from pathlib import Path

from servelab.config import REPO_ROOT
from servelab.evidence.bundle import build_bundle
from servelab.smk import job

with job(snakemake, "bundle") as say:  # noqa: F821
    out = Path(snakemake.output.manifest).parent  # noqa: F821
    manifest = build_bundle(out.parent, snakemake.params.config, out, REPO_ROOT)  # noqa: F821
    say(f"bundle: {len(manifest['files'])} files in {out}, every JSON file schema-validated")
    say(f"check it: servelab verify {out} --rebuild   (or: cd {out} && sha256sum -c SHA256SUMS)")
