from servelab.reproduce import reproduce_experiment, verdict_lines
from servelab.smk import experiment, job

with job(snakemake, "reproduce") as say:
    exp, paths = experiment(snakemake)
    result = reproduce_experiment(exp, paths)
    for line in verdict_lines(result):
        say(line)
    out = paths.reproduction
    say(f"details: {out}/report.md, {out}/reproduction.json")
