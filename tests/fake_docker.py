"""A stand-in for the docker (or podman) CLI, installed as `docker` on PATH in a temp folder.

State lives in $FAKE_DOCKER_STATE: calls.jsonl (every argv), pulled (after `pull`), and
containers/<name> (the pid of a running "container"). The image carries the digest in
$FAKE_DOCKER_REPO_DIGEST; it is local from the start when $FAKE_DOCKER_PRESENT is 1.

`run` parses docker's options, then runs the entrypoint and its arguments here, as the
container would: the environment holds only the variables named with -e (plus what a test
needs to find its fakes), and `--entrypoint python3 IMAGE -m vllm.entrypoints.cli.main serve`
(or the older `-m vllm.entrypoints.openai.api_server`) reaches tests/fake_vllm_server.py
through the `python3` shim next to this `docker`. A path under a mount's container side (in the
command) is read as its host side.
`stop [-t N | --timeout N] NAME` sends SIGTERM to the container and SIGKILL after N seconds
(default 10), as docker's CLI reference describes `docker container stop`; its deprecated
`--time` is refused here, so that nothing relies on it. `rm --force NAME` kills it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_DOCKER_STATE"])
VALUE_OPTS = {"--name", "--gpus", "--device", "-p", "-v", "-e", "--entrypoint", "--mount"}
KEEP_ENV = ("PATH", "HOME", "PYTHONPATH", "FAKE_DOCKER_STATE", "FAKE_NSYS_GENERATE_S", "TMPDIR")


def log(argv: list[str]) -> None:
    with open(STATE / "calls.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(argv) + "\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def image_inspect(ref: str) -> int:
    if os.environ.get("FAKE_DOCKER_PRESENT") != "1" and not (STATE / "pulled").exists():
        print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
        return 1
    info = {
        "Id": "sha256:" + "e" * 64,
        "RepoDigests": [os.environ["FAKE_DOCKER_REPO_DIGEST"]],
        "Config": {"Labels": {"dev.servelab.vllm.version": "0.27.1"}},
    }
    print(json.dumps([info]))
    return 0


def mounted(arg: str, volumes: list[str]) -> str:
    """A path inside the "container" as the host has it: -v HOST:CONTAINER[:MODE] maps the
    container's path back (this fake runs everything on the host)."""
    for spec in volumes:
        host, cont = spec.split(":")[:2]
        if host != cont and (arg == cont or arg.startswith(cont + "/")):
            if not os.path.exists(host):  # docker would bind an empty folder
                sys.exit(f"fake docker: mount source {host} does not exist")
            return host + arg[len(cont) :]
    return arg


def run(args: list[str]) -> int:
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if a in VALUE_OPTS:
            opts.setdefault(a, []).append(args[i + 1])
            i += 2
        else:
            opts.setdefault(a, []).append("")
            i += 1
    image, rest = args[i], args[i + 1 :]
    repo = os.environ["FAKE_DOCKER_REPO_DIGEST"].removeprefix("docker.io/").split("@")[0]
    if image.removeprefix("docker.io/").split("@")[0] != repo:
        print(f"fake docker: unexpected image {image}", file=sys.stderr)
        return 125
    command = [mounted(a, opts.get("-v", [])) for a in [opts["--entrypoint"][0], *rest]]
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.update({n: os.environ[n] for n in opts.get("-e", []) if n in os.environ})
    name = opts["--name"][0]
    (STATE / "containers").mkdir(exist_ok=True)
    (STATE / "containers" / name).write_text(str(os.getpid()))
    os.execvpe(command[0], command, env)


def stop(args: list[str]) -> int:
    timeout = 10.0
    i = 0
    while i < len(args) - 1:
        a = args[i]
        if a == "--time" or a.startswith("--time="):
            print("fake docker: --time is deprecated; use -t/--timeout", file=sys.stderr)
            return 125
        if a in ("-t", "--timeout"):
            timeout = float(args[i + 1])
            i += 2
        elif a.startswith("--timeout="):
            timeout = float(a.split("=", 1)[1])
            i += 1
        else:
            print(f"fake docker: stop: unknown option {a}", file=sys.stderr)
            return 125
    pidfile = STATE / "containers" / args[-1]
    if not pidfile.exists():
        print(f"Error: No such container: {args[-1]}", file=sys.stderr)
        return 1
    pid = int(pidfile.read_text())
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink()
    print(args[-1])
    return 0


def rm(args: list[str]) -> int:
    pidfile = STATE / "containers" / args[-1]
    if not pidfile.exists():
        print(f"Error: No such container: {args[-1]}", file=sys.stderr)
        return 1
    pid = int(pidfile.read_text())
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    pidfile.unlink()
    return 0


def inspect(args: list[str]) -> int:
    pidfile = STATE / "containers" / args[-1]
    if not pidfile.exists():
        return 1
    print(pidfile.read_text())
    return 0


def main(argv: list[str]) -> int:
    log(argv)
    cmd, args = argv[0], argv[1:]
    if cmd == "version":
        print("27.0.0-fake")
        return 0
    if cmd == "image" and args[0] == "inspect":
        return image_inspect(args[1])
    if cmd == "pull":
        (STATE / "pulled").write_text("")
        print(f"{args[0]}: Pulling from fake")
        return 0
    if cmd == "container" and args[0] == "inspect":  # docker/podman container inspect
        return inspect(args[1:])
    handlers = {"run": run, "stop": stop, "rm": rm, "inspect": inspect}
    return handlers[cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
