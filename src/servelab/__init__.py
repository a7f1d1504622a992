"""servelab: reproducible LLM-serving experiments with checkable evidence.

For notebooks: `servelab.points(path)` and `servelab.requests(path)` read an experiment's (or a
vllm-bench tree's) measurements as pandas DataFrames (docs/python.md). They are imported on
first use, so that `import servelab.<module>` does not load pandas and the analysis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from servelab.dataframes import points, requests

__all__ = ["__version__", "points", "requests"]


def __getattr__(name: str) -> object:
    if name in ("points", "requests"):
        from servelab import dataframes

        return getattr(dataframes, name)
    raise AttributeError(f"module 'servelab' has no attribute {name!r}")
