"""A non-editable install (`pip install .`, as a wheel is installed) carries what servelab reads
at run time: the config schema, the record schemas and the site's templates are package data,
so every example config validates from a directory that is not the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# examples that ship with a value to fill in: refused with the placeholder's message
PLACEHOLDERS = {
    "quickstart-cpu-podman.yaml": "runtime.image is not pinned",
    "v100-awq-max-num-seqs.yaml": "model.repo and model.revision are not pinned",
    # public traces fetched by the user (each file's header gives the command), not in the
    # repository
    "trace-azure-cpu.yaml": "says in its header where to fetch it",
    "trace-mooncake-cpu.yaml": "says in its header where to fetch it",
}

CHECK_ALL = """
import contextlib, io, sys
from servelab.cli import main
for path in sys.argv[1:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["check-config", path]) or 0
        except SystemExit as exc:
            rc = exc.code
    print(path, rc, err.getvalue().strip().splitlines()[-1:] or [""], sep="\\t")
"""


def test_a_non_editable_install_validates_every_example_elsewhere(tmp_path: Path) -> None:
    # the repository's tracked files, as a source distribution would hold them
    src = tmp_path / "src"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        f = REPO / name.decode()
        if f.is_file():
            (src / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            (src / name.decode()).write_bytes(f.read_bytes())
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    assert (site / "servelab" / "schemas" / "config.schema.yaml").is_file()
    # another directory, with the examples' committed datasets beside it (their paths are
    # relative to the working directory): not a public trace a user fetched into the checkout
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "datasets").mkdir(parents=True)
    for f in (REPO / "datasets").iterdir():
        if f.is_file():
            (elsewhere / "datasets" / f.name).symlink_to(f)
    examples = sorted((REPO / "config" / "experiments").glob("*.yaml"))
    out = subprocess.run(
        [sys.executable, "-c", CHECK_ALL, *map(str, examples)],
        cwd=elsewhere,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    said = {
        Path(p).name: (int(rc), err) for p, rc, err in (x.split("\t") for x in out.splitlines())
    }
    assert set(said) == {e.name for e in examples}
    for name, (rc, err) in said.items():
        if name in PLACEHOLDERS:
            assert rc != 0 and PLACEHOLDERS[name] in err, (name, err)
        else:
            assert rc == 0, (name, err)
    # the package it ran was the installed one, not the checkout
    where = subprocess.run(
        [sys.executable, "-c", "import servelab; print(servelab.__file__)"],
        cwd=elsewhere,
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(site))
