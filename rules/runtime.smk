# venv: created from its hashed lock (an input, so a changed lock rebuilds it). docker, podman,
# apptainer: the pinned image is checked and probed; nothing in the repository is an input.
rule runtime:
    input:
        unpack(runtime_inputs),
    output:
        record=f"{EXP}/runtime/runtime.json",
    params:
        exp=experiment_dir,
        runtime=config["runtime"],
        profile=config["profile"],
    resources:
        cpus_per_task=node_cpus,
        **WHOLE_NODE,
    group:
        MEASURE_GROUP
    log:
        f"{EXP}/logs/runtime.log",
    benchmark:
        f"{EXP}/benchmarks/runtime.tsv"
    script:
        "../scripts/runtime.py"
