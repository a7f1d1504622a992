"""servelab: reproducible LLM-serving experiments with checkable evidence."""

__version__ = "0.1.0"
