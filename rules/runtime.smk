# venv: created from its hashed lock (an input, so a changed lock rebuilds it). docker, podman,
# apptainer: the pinned image is checked and probed; nothing in the repository is an input.
# On a GPU runtime it also checks, before any server starts, that the GPUs can run the
# runtime's PyTorch and each quantization, and that the host's Nsight Systems runs in the image.
from servelab.env.runtime import gpu as _runtime_gpu


rule runtime:
    input:
        unpack(runtime_inputs),
    output:
        record=f"{EXP}/runtime/{_paths.RUNTIME_FILE}",
    params:
        exp=experiment_dir,
        runtime=config["runtime"],
        profile=config["profile"],
        # the quantizations the GPU pre-flight checks (servelab.env.runtime.gpu): a change reruns it
        quantization=[
            f"{u.where}: {u.method}" for u in _runtime_gpu.quantizations(_EXPERIMENT.server)
        ],
    # the measurement slot too: creating a venv or pulling and probing an image loads the host,
    # and in a campaign one experiment's runtime must not be built beside another's sweep
    resources:
        measure=1,
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


# The other benchmark tools of client.cross_check (servelab.env.client_tools): each installed
# into its own venv from its hashed lock in envs/ (an input, so a changed lock rebuilds it);
# vllm bench serve runs from the server runtime's venv, read from its record.
from servelab.env import client_tools as _client_tools


rule client_tools:
    input:
        locks=_client_tools.tool_locks(CROSS_CHECK, "envs"),
        runtime=rules.runtime.output.record,
    output:
        record=f"{EXP}/runtime/{_paths.CLIENTS_FILE}",
    params:
        exp=experiment_dir,
        tools=CROSS_CHECK,
    resources:
        measure=1,
        cpus_per_task=node_cpus,
        **WHOLE_NODE,
    group:
        MEASURE_GROUP
    log:
        f"{EXP}/logs/client_tools.log",
    benchmark:
        f"{EXP}/benchmarks/client_tools.tsv"
    script:
        "../scripts/client_tools.py"


# A configuration with a runtime of its own (server.configs[].runtime: another lock or image,
# e.g. another vLLM release): made ready as the shared one is, into runtime/<sc>/runtime.json,
# which that configuration's measuring jobs read instead of runtime/runtime.json.
rule config_runtime:
    input:
        unpack(config_runtime_inputs),
    output:
        record=f"{EXP}/runtime/{{sc}}/{_paths.RUNTIME_FILE}",
    params:
        exp=experiment_dir,
        runtime=config["runtime"],
        # a changed lock or image reruns it
        own=lambda w: next(c["runtime"] for c in config["server"]["configs"] if c["name"] == w.sc),
        profile=config["profile"],
    wildcard_constraints:
        sc=one_of(OWN_RUNTIME),
    resources:
        measure=1,
        cpus_per_task=node_cpus,
        **WHOLE_NODE,
    group:
        MEASURE_GROUP
    log:
        f"{EXP}/logs/runtime-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/runtime-{{sc}}.tsv"
    script:
        "../scripts/runtime.py"
