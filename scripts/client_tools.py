"""The client_tools stage (rules/runtime.smk): the venvs of client.cross_check's tools, made
ready from their hashed locks (servelab.env.client_tools), recorded in runtime/clients.json."""

from pathlib import Path

from servelab.env.client_tools import ensure_tools
from servelab.smk import experiment, job
from servelab.store.records import ClientsRecord, RuntimeRecord

with job(snakemake, "client_tools") as say:
    exp, paths = experiment(snakemake)
    envs = Path("envs")  # as the rule names the locks, beside runtime.lock's envs/
    runtime = RuntimeRecord.read(Path(snakemake.input.runtime))
    record = ensure_tools(exp.cross_check, envs, runtime.doc, say)
    ClientsRecord.new(record).write(Path(snakemake.output.record))
