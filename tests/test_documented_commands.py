"""Every command the README and docs show works after the README's install line.

Commands are read from the fenced bash blocks of README.md, docs/*.md and the READMEs of the
repository's folders. Each `servelab ...` line must parse with the real command-line parser;
each `python <script> ...` line must name a script whose --help accepts its options; each
`snakemake ...` line must use options snakemake knows and targets the workflow has, and
`--report` needs what snakemake's report needs installed. The main end-to-end test runs
`snakemake --report` for real on a finished run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from workflow_env import snakemake_env

REPO = Path(__file__).resolve().parents[1]
PROVIDED = ("servelab", "snakemake", "python", "pip")


def documented_files() -> list[Path]:
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted(p for p in REPO.glob("*/README.md")),
        *sorted((REPO / "evidence").rglob("README.md")),
    ]


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every command of the project's own programs, continuation lines
    joined, `a && b` split, comments dropped."""
    out: list[tuple[str, str]] = []
    for path in documented_files():
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.split(" #", 1)[0].strip()
                for cmd in (c.strip() for c in line.split("&&")):
                    if cmd.split(" ", 1)[0] in PROVIDED:
                        out.append((path.relative_to(REPO).as_posix(), cmd))
    return out


COMMANDS = documented_commands()


def _argv(cmd: str) -> list[str]:
    # placeholders a reader fills in: <name>, PORT, PID
    cmd = re.sub(r"<[^>]+>", "x", cmd).replace("PORT", "8000").replace("PID", "1")
    return shlex.split(cmd)


@cache
def snakemake_help() -> str:
    proc = subprocess.run(
        ["snakemake", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        env=snakemake_env(),
    )
    return proc.stdout


@cache
def workflow_rules() -> set[str]:
    proc = subprocess.run(
        ["snakemake", "--list-rules"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        env=snakemake_env(),
    )
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()}


def test_commands_are_found() -> None:
    progs = {cmd.split(" ", 1)[0] for _, cmd in COMMANDS}
    assert {"servelab", "snakemake", "python", "pip"} <= progs
    assert ("README.md", "snakemake --report report.html") in COMMANDS


@pytest.mark.parametrize(
    "where,cmd", [c for c in COMMANDS if c[1].startswith("servelab ")], ids=lambda x: str(x)
)
def test_servelab_command_parses(where: str, cmd: str) -> None:
    from servelab.cli import build_parser

    try:
        build_parser().parse_args(_argv(cmd)[1:])
    except SystemExit as exc:  # argparse's way of refusing
        pytest.fail(f"{where}: `{cmd}` is refused by the servelab parser (exit {exc.code})")


@pytest.mark.parametrize(
    "where,cmd", [c for c in COMMANDS if c[1].startswith("snakemake")], ids=lambda x: str(x)
)
def test_snakemake_command_uses_known_options_and_targets(where: str, cmd: str) -> None:
    argv = _argv(cmd)[1:]
    help_text = snakemake_help()
    takes_value = {"--cores", "--configfile", "--report", "--profile", "--workflow-profile"}
    targets: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-"):
            targets.append(arg)
            continue
        opt = arg.split("=", 1)[0]
        assert re.search(rf"(^|[\s,]){re.escape(opt)}\b", help_text), f"{where}: {opt}"
        if opt == "--workflow-profile":
            assert (REPO / argv[i] / "config.yaml").is_file(), f"{where}: {argv[i]}"
        if opt in ("--config", "--default-resources"):  # KEY=VALUE ...
            while i < len(argv) and "=" in argv[i] and not argv[i].startswith("-"):
                i += 1
        elif opt in takes_value and "=" not in arg:
            i += 1
    assert not targets or set(targets) <= workflow_rules(), f"{where}: {targets}"
    if "--report" in argv:
        for mod in ("pygments", "jinja2"):
            assert importlib.util.find_spec(mod), f"{where}: `{cmd}` needs {mod} installed"


# Runs each script given with `--help` as `python <script> --help` would, all in one process
# (one interpreter start, its imports shared): the script as __main__, sys.argv and sys.path[0]
# as Python sets them for a script; what it printed, and the exit status the process would
# have, go to the JSON file named first. Between scripts, sys.path is restored and every module
# imported from the repository's own folders (benchmarks/, scripts/, tests/) is forgotten, so
# that no script finds a helper only because another put it on the path. (servelab and the
# third-party packages stay imported: a fresh process finds them without any path set up.)
HELP_RUNNER = r"""
import contextlib, io, json, os, runpy, sys, traceback

out_file, repo, scripts = sys.argv[1], sys.argv[2], sys.argv[3:]
local = tuple(os.path.join(repo, d) + os.sep for d in ("benchmarks", "scripts", "tests"))
path = list(sys.path)
done = {}
for script in scripts:
    sys.argv = [script, "--help"]
    sys.path[:] = [os.path.dirname(os.path.abspath(script))] + path[1:]
    printed, errors = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    done[script] = [code, printed.getvalue(), errors.getvalue()]
    sys.path[:] = path
    for name, mod in list(sys.modules.items()):
        if str(getattr(mod, "__file__", None) or "").startswith(local):
            del sys.modules[name]
with open(out_file, "w", encoding="utf-8") as fh:
    json.dump(done, fh)
"""


@cache
def script_helps() -> dict[str, tuple[int, str, str]]:
    """`python <script> --help` of every script a documented command runs: its exit status,
    stdout and stderr (one process for them all: HELP_RUNNER)."""
    import tempfile

    scripts = sorted(
        {
            argv[0]
            for argv in (_argv(cmd)[1:] for _, cmd in COMMANDS if cmd.startswith("python "))
            if argv[0] != "-m" and (REPO / argv[0]).is_file()
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "helps.json"
        proc = subprocess.run(
            [sys.executable, "-c", HELP_RUNNER, str(out), str(REPO), *scripts],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
        )
        assert proc.returncode == 0 and out.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
        done = json.loads(out.read_text(encoding="utf-8"))
    return {script: (int(code), str(o), str(e)) for script, (code, o, e) in done.items()}


@pytest.mark.parametrize(
    "where,cmd", [c for c in COMMANDS if c[1].startswith("python ")], ids=lambda x: str(x)
)
def test_python_command_script_accepts_its_options(where: str, cmd: str) -> None:
    argv = _argv(cmd)[1:]
    if argv[0] == "-m":
        name = argv[1]
        if name == "pytest":
            assert importlib.util.find_spec("pytest")
            return
        if name == "venv":
            return
        pytest.fail(f"{where}: unexpected module {name}")
    script = REPO / argv[0]
    assert script.is_file(), f"{where}: {argv[0]} does not exist"
    code, stdout, stderr = script_helps()[argv[0]]
    assert code == 0, f"{where}: {argv[0]} --help: {stderr[-500:]}"
    for opt in (a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")):
        assert opt in stdout, f"{where}: {argv[0]} has no option {opt}"


def test_install_line_installs_report_dependencies() -> None:
    """`snakemake --report` needs pygments and jinja2: the package must depend on them, so
    the README's install line brings them."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!; \[]", d, maxsplit=1)[0].lower() for d in deps}
    assert {"pygments", "jinja2"} <= names
