"""The profiling pass: capture (nsys or vLLM's torch profiler) and trace analysis.

- `capture`: the capture job: the diagnostic workload and its windows.
- `commands`: the command lines (nsys, vLLM's profiler settings and interface).
- `plan`: which configurations are profiled, with which tool.
- `nsys`: analysis of an `nsys export --type sqlite` file, in SQL passes.
- `torchtrace`: analysis of a torch-profiler trace JSON.
- `core`: the pure pieces both share (families, forwards, steady state, ratios).
- `report`: profile.json, CSV tables and the report section.
"""
