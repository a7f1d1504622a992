"""search.json's document, as `analysis.search` writes it (`SearchResult.to_json`) and the
report and the claims read it: the spec, the path (every rate measured, with its repeats) and
the answer."""

from __future__ import annotations
