# The static evidence site (docs/site.md) over the committed releases and reproductions:
#   snakemake --cores 1 site
# builds build/site/ (open build/site/index.html in a browser), as `servelab site evidence
# --out build/site` does. Every release is verified while the site is built; one that does
# not verify is shown as such and named in a warning line.

import sys
from pathlib import Path

SITE_EVIDENCE = "evidence"
SITE_OUT = "build/site"


rule site:
    localrule: True
    input:
        # every file of the evidence folder: the site is rebuilt when any of them changes
        lambda wildcards: sorted(str(p) for p in Path(SITE_EVIDENCE).rglob("*") if p.is_file()),
    output:
        index=f"{SITE_OUT}/index.html",
    params:
        python=sys.executable,
        evidence=SITE_EVIDENCE,
        out=lambda wildcards, output: str(Path(output.index).parent),
    log:
        "build/site.log",
    shell:
        "{params.python:q} -m servelab.cli site {params.evidence:q} --out {params.out:q}"
        " 2>&1 | tee {log:q}"
