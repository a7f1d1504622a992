"""Make tests/fixtures/tools/: real result files of three other LLM-serving benchmark tools
(AIPerf, GuideLLM, inference-perf), each run against a live OpenAI-compatible server.

    python scripts/make_tool_fixtures.py --url http://127.0.0.1:8100 --model servelab-tiny \\
        --tokenizer ~/.cache/servelab/models/tiny/<revision> --out tests/fixtures/tools

Every tool measures the same point as servelab's default c=4: a closed loop of 4 concurrent
requests, 16 requests in all, synthetic prompts of 128 input tokens asking for 64 output tokens
(ignore_eos; temperature 0 where the tool can set it), streamed from /v1/completions. AIPerf
and GuideLLM run three times (rep01, rep02, rep03), inference-perf once (run01); each run writes
into <out>/<tool>/<run>/ exactly as the tool lays it out. tests/fixtures/tools/<tool>/MADE.md
records the command lines this script runs (only the output paths differ) and
tests/fixtures/tools/README.md the layout and fields of what each tool writes.

Each tool runs from its own virtual environment (--aiperf-venv and so on, default
/tmp/toolvenvs/<tool>), made with `python -m venv` and `pip install aiperf==0.13.0`,
`guidellm==0.8.1`, `inference-perf==0.7.0` (inference-perf needs Python >= 3.12). The script
checks each venv holds that version, writes its `pip freeze` to <out>/<tool>/pip-freeze.txt,
and refuses to overwrite a run directory that exists unless given --force. Runs are not
deterministic (they time a live server); the test suite never runs this script.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tools"
VENVS = Path("/tmp/toolvenvs")
VERSIONS = {"aiperf": "0.13.0", "guidellm": "0.8.1", "inference-perf": "0.7.0"}
RUNS = {
    "aiperf": ["rep01", "rep02", "rep03"],
    "guidellm": ["rep01", "rep02", "rep03"],
    "inference-perf": ["run01"],
}
CONCURRENCY = 4
REQUESTS = 16
INPUT_TOKENS = 128
OUTPUT_TOKENS = 64
BIG_BYTES = 200_000  # a kept file above this is reported: the fixtures must stay small


def aiperf_cmd(venv: Path, url: str, model: str, tokenizer: str, run_dir: Path) -> list[str]:
    """AIPerf's `profile`: per-request records (profile_export.jsonl) and summaries; no GPU
    telemetry (a CPU host), no /metrics scrape (server metrics are not needed to read the
    results), no dashboard. ignore_eos and temperature go into the body via --extra-inputs."""
    return [
        str(venv / "bin" / "aiperf"),
        "profile",
        "--url",
        url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--concurrency",
        str(CONCURRENCY),
        "--request-count",
        str(REQUESTS),
        "--isl",
        str(INPUT_TOKENS),
        "--isl-stddev",
        "0",
        "--osl",
        str(OUTPUT_TOKENS),
        "--osl-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--extra-inputs",
        "temperature:0",
        "--random-seed",
        "0",
        "--export-level",
        "records",
        "--ui-type",
        "none",
        "--no-gpu-telemetry",
        "--no-server-metrics",
        "--artifact-dir",
        str(run_dir),
    ]


def guidellm_cmd(venv: Path, url: str, model: str, tokenizer: str, run_dir: Path) -> list[str]:
    """GuideLLM's `run` with its key=value argument strings: the concurrent profile (closed
    loop), a max_requests constraint, synthetic_text data (GuideLLM adds ignore_eos itself when
    output_tokens is set), temperature 0 through the backend's extras.body."""
    backend = (
        f"kind=openai_http,target={url},model={model},request_format=/v1/completions,"
        "stream=true,extras.body.temperature=0"
    )
    return [
        str(venv / "bin" / "guidellm"),
        "run",
        "--backend",
        backend,
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer}",
        "--profile",
        f"kind=concurrent,streams={CONCURRENCY}",
        "--constraint",
        f"kind=max_requests,count={REQUESTS}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--seed",
        "kind=static,value=0",
        "--output",
        f"kind=json,path={run_dir / 'benchmarks.json'}",
        "--output",
        f"kind=csv,path={run_dir / 'benchmarks.csv'}",
        "--disable-progress",
    ]


def inference_perf_config(url: str, model: str, tokenizer: str, run_dir: Path) -> str:
    """inference-perf's YAML config: random token prompts of a fixed length (its `random` data
    needs the tokenizer), the concurrent load type, one worker, the per-request report without
    the raw response and its chunks (they would make the file megabytes) but with the computed
    per-request metrics. inference-perf sets no temperature: the server's default applies."""
    return f"""api:
  type: completion
  streaming: true
data:
  type: random
  input_distribution: {{type: fixed, min: {INPUT_TOKENS}, max: {INPUT_TOKENS}, \
mean: {INPUT_TOKENS}, std_dev: 0, total_count: {REQUESTS}}}
  output_distribution: {{type: fixed, min: {OUTPUT_TOKENS}, max: {OUTPUT_TOKENS}, \
mean: {OUTPUT_TOKENS}, std_dev: 0, total_count: {REQUESTS}}}
load:
  type: concurrent
  stages:
    - {{num_requests: {REQUESTS}, concurrency_level: {CONCURRENCY}}}
  num_workers: 1
  base_seed: 0
server:
  type: vllm
  model_name: {model}
  base_url: {url}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: {tokenizer}
report:
  request_lifecycle:
    summary: true
    per_stage: true
    per_request: true
    per_request_fields: {{request: true, response: false, info: true, \
response_chunks: false, computed_metrics: true}}
storage:
  local_storage: {{path: {run_dir}}}
"""


def inference_perf_cmd(venv: Path, config: Path) -> list[str]:
    """inference-perf reads everything from its config file."""
    return [str(venv / "bin" / "inference-perf"), "-c", str(config)]


def check_venv(tool: str, venv: Path) -> None:
    """Exit with a one-line error unless the venv has the tool at the pinned version."""
    python = venv / "bin" / "python"
    if not python.exists():
        sys.exit(
            f"{python}: no venv for {tool}; make it: python -m venv {venv} && "
            f"{venv}/bin/pip install {tool}=={VERSIONS[tool]}"
        )
    probe = f"import importlib.metadata as m; print(m.version({tool!r}))"
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    version = found.stdout.strip()
    if found.returncode != 0 or version != VERSIONS[tool]:
        sys.exit(
            f"{venv}: {tool} is {version or 'missing'}, want {VERSIONS[tool]}; "
            f"run {venv}/bin/pip install {tool}=={VERSIONS[tool]}"
        )


def run(cmd: list[str], stdout_file: Path | None) -> None:
    """Run one tool command; its console output goes to stdout_file (kept as a fixture) or,
    where the tool writes its own console export, is shown only if the command fails."""
    print("+", shlex.join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if stdout_file is not None:
        stdout_file.write_text(done.stdout)
    if done.returncode != 0:
        sys.exit(f"{cmd[0]} exited {done.returncode}; its last output:\n{done.stdout[-3000:]}")


def prepare(run_dir: Path, force: bool) -> None:
    """Refuse to overwrite a run directory unless --force (then remove it first)."""
    if run_dir.exists():
        if not force:
            sys.exit(f"{run_dir} exists; remove it or pass --force to remake it")
        shutil.rmtree(run_dir)


def report_big(tool_dir: Path) -> None:
    """Name every kept file over BIG_BYTES, so a tool upgrade that bloats its output shows."""
    for f in sorted(tool_dir.rglob("*")):
        if f.is_file() and f.stat().st_size > BIG_BYTES:
            print(f"warning: {f} is {f.stat().st_size} bytes (over {BIG_BYTES})")


def make_tool(tool: str, venv: Path, args: argparse.Namespace) -> None:
    """Run one tool's runs into args.out/<tool>/ and record its pip freeze."""
    check_venv(tool, venv)
    tool_dir: Path = args.out / tool
    tool_dir.mkdir(parents=True, exist_ok=True)
    freeze = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    )
    (tool_dir / "pip-freeze.txt").write_text(freeze.stdout)
    build: Callable[[Path, str, str, str, Path], list[str]]
    for name in RUNS[tool]:
        run_dir = (tool_dir / name).resolve()
        prepare(run_dir, args.force)
        if tool == "inference-perf":
            config = tool_dir / f"{name}.config.yml"
            config.write_text(inference_perf_config(args.url, args.model, args.tokenizer, run_dir))
            run(inference_perf_cmd(venv, config), tool_dir / f"{name}.stdout.txt")
            continue
        build = aiperf_cmd if tool == "aiperf" else guidellm_cmd
        cmd = build(venv, args.url, args.model, args.tokenizer, run_dir)
        if tool == "guidellm":
            run_dir.mkdir(parents=True)
            run(cmd, tool_dir / f"{name}.stdout.txt")
        else:  # AIPerf keeps its own console export and log in the run directory
            run(cmd, None)
    report_big(tool_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's base URL, no /v1")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--tokenizer", required=True, help="a local tokenizer directory")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    for tool in VERSIONS:
        ap.add_argument(f"--{tool}-venv", type=Path, default=VENVS / tool)
    ap.add_argument("--tools", nargs="+", choices=list(VERSIONS), default=list(VERSIONS))
    ap.add_argument("--force", action="store_true", help="replace run directories that exist")
    args = ap.parse_args()
    args.url = args.url.rstrip("/")
    for tool in args.tools:
        make_tool(tool, getattr(args, f"{tool.replace('-', '_')}_venv"), args)


if __name__ == "__main__":
    main()
