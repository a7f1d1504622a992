"""A stand-in for the apptainer CLI: `--version`, `pull FILE docker://REF` (writes FILE), and
`exec [--cleanenv] [--nv] [--bind SPEC]... IMAGE COMMAND...`, which runs COMMAND here with only
the APPTAINERENV_* variables (names without the prefix) and what a test needs to find its fakes.
Every argv goes to $FAKE_APPTAINER_LOG."""

from __future__ import annotations

import json
import os
import sys

KEEP_ENV = ("PATH", "HOME", "PYTHONPATH", "TMPDIR")


def main(argv: list[str]) -> int:
    with open(os.environ["FAKE_APPTAINER_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(argv) + "\n")
    if argv[0] == "--version":
        print("apptainer version 1.3.4-fake")
        return 0
    if argv[0] == "pull":
        with open(argv[1], "wb") as out:
            out.write(b"SIF fake image of " + argv[2].encode())
        return 0
    assert argv[0] == "exec", argv
    i = 1
    while argv[i].startswith("-"):
        i += 2 if argv[i] == "--bind" else 1
    command = argv[i + 1 :]
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.update(
        {
            k.removeprefix("APPTAINERENV_"): v
            for k, v in os.environ.items()
            if k.startswith("APPTAINERENV_")
        }
    )
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
