"""Analysis speed: 3 repeats x 3 points x 2,048 requests per point, servelab layout.

Run: python benchmarks/bench_analysis.py   (prints seconds for load + tables, and with figures)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from analysis_fixtures import servelab_point  # noqa: E402

from servelab.analysis.pipeline import analyze  # noqa: E402


def main() -> None:
    # no options: --help says what it measures (and measures nothing)
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "exp"
        for rep in (1, 2, 3):
            for conc, tput in ((64, 4255.0), (128, 4996.0), (256, 4773.0)):
                servelab_point(
                    exp, "bench", rep, conc, tput * (1 + 0.001 * rep), 400.0, n=2048, out_tokens=128
                )
        t0 = time.perf_counter()
        analyze(exp, Path(tmp) / "out-tables", figures=False)
        tables = time.perf_counter() - t0
        t0 = time.perf_counter()
        analyze(exp, Path(tmp) / "out-all", figures=True)
        full = time.perf_counter() - t0
    print(
        f"analysis of 3 repeats x 3 points x 2,048 requests x 128 chunks: "
        f"tables {tables:.2f} s, with figures {full:.2f} s"
    )


if __name__ == "__main__":
    main()
