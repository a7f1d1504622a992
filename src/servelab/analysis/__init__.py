"""Analysis: tables, verdicts, figures and the report, as pure functions of raw data."""
