"""The measuring stages: the sweep of a server configuration (sweep), its sequential rounds
(sequential), and the SLO search's measuring loop (slo_search; the search itself is
servelab.analysis.search)."""
