"""The profiling pass: capture (nsys or vLLM's torch profiler) and trace analysis.

- `capture`: the capture job: the diagnostic workload and its windows.
- `commands`: the command lines (nsys, vLLM's profiler settings and interface).
- `nsys_report`: the nsys report of a capture: waited for, found, exported.
- `plan`: which configurations are profiled, with which tool.
- `windows`: windows.json, read and checked, and windows mapped into a trace's clock.
- `nsys`: reading an `nsys export --type sqlite` file, in SQL passes.
- `nsys_main`: the main attention kernel's launches read from an nsys export in one pass.
- `steps`: vLLM's engine steps as its NVTX ranges name them.
- `stepmatch`: vLLM's steps matched to the forwards (and, where the grid does not follow the
  batch, the forwards' populations from them).
- `gpumatch`: the trace's GPUs matched to the telemetry's by UUID.
- `torchtrace`: reading a torch-profiler trace JSON.
- `kernels`: kernel families, the main attention kernel, per-kernel tables.
- `forwards`: forwards from attention launches, the steady state, ratios between windows.
- `codepaths`: the attention kernel's code paths (grid dimensions that do not grow with the
  batch), their steady state, and the localisation verdict between windows.
- `passes`: the passes over a trace (nsys or torch) the analysis is made from.
- `trace_analysis`: a trace and its windows in, the profile out (`analyze_trace`).
- `rendering`: a profile rendered: the CSV tables and the report section (profile.md).
- `report`: the `profile_report` stage (`analyze_capture`): profile.json, the CSV tables and
  profile.md of one captured configuration, written by `write_profile`.

`servelab profile analyze` is `servelab.cli.profile`.
"""
