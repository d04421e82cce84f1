"""A stand-in for `vllm serve` on a sandbox node (docs/sandbox.md): vLLM's command line, HTTP
API and metrics, served by poolctl's serving model in wall time. `python -m
poolctl.sandbox.vllm [vLLM flags]` runs it; the sandbox's `docker` stand-in starts it with
the container's arguments and environment."""
