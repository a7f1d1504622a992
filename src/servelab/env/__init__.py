"""What a server runs with, pinned: the runtime (runtime: a venv from a hashed lock, a container
image by digest, the GPU pre-flight, Nsight Systems), the container invocation (container), the
model (model), the compile cache (compilecache), and a server servelab did not launch
(endpoint, endpoint_config)."""
