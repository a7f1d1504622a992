"""The thin layer between a Snakemake `script:` and the library.

`job(snakemake, stage)` sends progress to the terminal and to the rule's log, times the stage,
and turns an expected error (ServelabError) into one clear line instead of a traceback.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from servelab.errors import ServelabError


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def __call__(self, line: str) -> None:
        for s in self.streams:
            s.write(line + "\n")
            s.flush()


@contextmanager
def job(smk: Any, stage: str) -> Iterator[Callable[[str], None]]:
    log_path = smk.log[0] if len(smk.log) else None
    log: TextIO = open(log_path, "w", encoding="utf-8") if log_path else sys.stderr  # noqa: SIM115
    say = _Tee(sys.stdout, log) if log_path else _Tee(sys.stdout)
    t0 = time.monotonic()
    say(f"== {stage}: started")
    try:
        yield say
    except ServelabError as exc:
        say(f"== {stage}: FAILED after {time.monotonic() - t0:.1f} s")
        msg = f"servelab error ({stage}): {exc}"
        log.write(msg + "\n")
        sys.stderr.write(msg + "\n")
        log.flush()
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        say(f"== {stage}: interrupted after {time.monotonic() - t0:.1f} s")
        raise SystemExit(130) from None
    except BaseException:
        log.write(traceback.format_exc())
        log.flush()
        raise
    else:
        say(f"== {stage}: done in {time.monotonic() - t0:.1f} s")
    finally:
        if log_path:
            log.close()
