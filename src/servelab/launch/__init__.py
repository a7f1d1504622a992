"""A vLLM server's launch: starting and stopping its process (server), a measuring job's
launch on one server configuration with its lock, placement and records (session), and what
its startup log says (serverlog: start phases, KV capacity, CUDA graph sizes)."""
