"""`servelab crosscheck RUN TREE...`: other tools' runs of the same points beside a servelab
run (servelab.analysis.clients)."""

from __future__ import annotations

import argparse
from pathlib import Path

from servelab.errors import ServelabError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    p = sub.add_parser(
        "crosscheck",
        help="other tools' runs of the same points beside a servelab run",
        description="Set the runs of other benchmark tools (AIPerf, GuideLLM, inference-perf, "
        "vllm bench serve; each a tree of rep_<NN>/concurrency_<CCC>/ or rate_<R>/ folders) "
        "beside a "
        "servelab run of the same server and points: per tool, level and metric (output "
        "throughput, mean TTFT, mean ITL) both means and the tool's over servelab's with its "
        "95% interval, and the known causes of a disagreement the data shows "
        '(docs/analysis.md, "Clients compared"). Both sides are held to the run\'s own '
        "analysis.validity bounds.",
    )
    p.add_argument("run", help="the servelab run: release folder, .tar.gz, bundle or results/<exp>")
    p.add_argument("trees", nargs="+", metavar="tree", help="a tool's tree of runs")
    p.add_argument(
        "--config", help="the run's server configuration they measured (default: its only one)"
    )
    p.add_argument("--out", help="also write clients.md here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tempfile

    from servelab.analysis.benchtree import vllm_bench_files
    from servelab.analysis.clients import Tool, clients_section
    from servelab.analysis.dataset import load_dataset
    from servelab.analysis.groups import Groups
    from servelab.analysis.peers import tool_version
    from servelab.reproduce.sides import open_side

    with tempfile.TemporaryDirectory() as tmp:
        side = open_side(Path(args.run), Path(tmp), "servelab run")
        if side.kind == "vllm-bench":
            raise ServelabError(f"{args.run}: a tree of another tool's runs; give servelab's run")
        # both clients' points held to the run's own bounds (its analysis.validity)
        validity = side.analysis.validity
        ours = Groups(load_dataset(side.root, validity=validity))
    config = args.config
    if config is None:
        if len(ours.configs) != 1:
            raise ServelabError(
                f"{args.run}: server configurations {', '.join(ours.configs)}; name the one the "
                "tools measured with --config"
            )
        (config,) = ours.configs
    elif config not in ours.configs:
        raise ServelabError(
            f"--config {config}: not a server configuration of {args.run} "
            f"({', '.join(ours.configs)})"
        )
    tools = []
    for tree in map(Path, args.trees):
        files = vllm_bench_files(tree) if tree.is_dir() else []
        if not files:
            raise ServelabError(f"{tree}: no tool runs (rep_<NN>/concurrency_<CCC>/...) in it")
        made = tool_version(files[0].path, files[0].tool) or "vllm bench serve"
        data = load_dataset(tree, validity=validity)
        tools.append(Tool(f"{made} ({tree.name})", data, key=files[0].tool))
    lines = clients_section(ours, config, tools, validity)
    text = "\n".join(lines)
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "clients.md").write_text(text, encoding="utf-8")
    return 0
