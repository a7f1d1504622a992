from servelab.config import REPO_ROOT
from servelab.evidence.bundle import build_bundle
from servelab.smk import experiment, job

with job(snakemake, "bundle") as say:
    exp, paths = experiment(snakemake)
    out = paths.bundle
    # the bundle records the config its rule sees (params.config: not reference/reproduction)
    unseen = set(exp.to_dict()) - set(snakemake.params.config)
    manifest = build_bundle(exp, paths, out, REPO_ROOT, leave_out=unseen)
    say(f"bundle: {len(manifest['files'])} files in {out}, every JSON file schema-validated")
    say(f"check it: servelab verify {out} --rebuild   (or: cd {out} && sha256sum -c SHA256SUMS)")
