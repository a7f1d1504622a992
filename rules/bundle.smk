# The evidence bundle (docs/bundle.md) and, as an explicit target, a frozen release:
#   snakemake --cores all release --config release_tag=v1 [release_allow_unpinned=true]

from pathlib import Path


rule bundle:
    localrule: True
    input:
        report=f"{EXP}/analysis/report.md",
        summary=f"{EXP}/summary.txt",
        profile=PROFILE_OUTPUTS,
    output:
        # files, not directory(): Snakemake would leave a timestamp file inside the bundle
        manifest=f"{EXP}/bundle/manifest.json",
        sums=f"{EXP}/bundle/SHA256SUMS",
    params:
        exp=experiment_dir,
        config=EXPERIMENT_CONFIG,
    log:
        f"{EXP}/logs/bundle.log",
    benchmark:
        f"{EXP}/benchmarks/bundle.tsv"
    script:
        "../scripts/bundle.py"


EVIDENCE = "evidence"  # releases: evidence/<experiment>/<tag>/


rule release:
    localrule: True
    input:
        manifest=f"{EXP}/bundle/manifest.json",
    output:
        release=f"{EVIDENCE}/{config['experiment']}/{RELEASE_TAG or 'UNSET'}/release.json",
    params:
        exp=experiment_dir,
        # evidence/ (the release folder's grandparent), from the output as for params.exp
        evidence=lambda wildcards, output: str(Path(output.release).parents[2]),
        tag=RELEASE_TAG,
        allow_unpinned=RELEASE_ALLOW_UNPINNED,
    log:
        f"{EXP}/logs/release.log",
    script:
        "../scripts/release.py"
