"""`python -m poolctl.sandbox.vllm [vLLM flags]`: the stand-in engine of one node.

Environment (set by the sandbox's `docker` stand-in): POOLCTL_NODE_ADDRESS, the node's
loopback address to listen on (127.0.0.1 by default; anything outside 127.0.0.0/8 is refused);
POOLCTL_NODE_INSTANCE_TYPE, the node's type (the GPUs the serving model times);
POOLCTL_SANDBOX_SPEED, pool seconds per wall second (1); POOLCTL_SANDBOX_MODEL, the pool's
`model:` fields as JSON (what the engine serves as); POOLCTL_ENGINE_SLOWDOWN, every step this
many times as long as the serving model times it (1; the sandbox's --engine-slowdown: a GPU
that does worse than the pool's model believes); POOLCTL_ENGINE_START_S, the engine's
planned start (loading weights into HBM, CUDA graphs) in pool seconds, waited before the port
opens as vLLM's does; POOLCTL_VLLM_CACHE_DIR, the host folder the container's /root/.cache is
(the `docker` stand-in reads it from `-v`), and POOLCTL_ENGINE_COMPILE_MISS_S, the pool
seconds torch.compile adds when that folder holds no compile cache
(vllm/torch_compile_cache/): the engine then "compiles" and writes one there, as vLLM does;
VLLM_API_KEY, as vLLM reads it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import sys

from poolctl.errors import UsageError
from poolctl.sandbox.vllm import streamer
from poolctl.sandbox.vllm.flags import PROG, FlagError, known_flags, parse
from poolctl.sandbox.vllm.live import Live
from poolctl.sandbox.vllm.model import serving_model
from poolctl.sandbox.vllm.server import Server
from poolctl.servingmodel import slowed


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        v = default if raw is None else float(raw)
    except ValueError:
        v = -1.0
    if not (v >= 0 and v != float("inf")):
        sys.exit(f"{PROG}: {name}={raw}: not a number of 0 or more")
    return v


def compile_cache(miss_s: float) -> float:
    """The seconds torch.compile adds to this start: none when the cache folder holds a
    compile cache (fetched from the pool's shared one, or kept on the node's root volume),
    else `miss_s`, after which the "compiled" artifacts are written there as vLLM writes
    its (~/.cache/vllm/torch_compile_cache/<hash>/rank_0_0/)."""
    root = os.environ.get("POOLCTL_VLLM_CACHE_DIR")
    if not root or not miss_s:
        return 0.0
    cache = os.path.join(root, "vllm", "torch_compile_cache")
    if os.path.isdir(cache) and os.listdir(cache):
        print("INFO Using cache directory for vLLM's torch.compile (poolctl stand-in): hit",
              flush=True)
        return 0.0
    rank = os.path.join(cache, "sandbox", "rank_0_0")
    os.makedirs(rank, exist_ok=True)
    with open(os.path.join(rank, "artifacts.bin"), "wb") as f:
        f.write(b"\0" * 1024)
    print(f"INFO torch.compile (poolctl stand-in): no cache, {miss_s:g} s more", flush=True)
    return miss_s


async def serve(argv: list[str]) -> None:
    try:
        args = parse(argv)
    except FlagError as e:
        print(f"usage: {PROG} [model_tag] [options]\n{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    host = os.environ.get("POOLCTL_NODE_ADDRESS", "127.0.0.1")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        sys.exit(f"{PROG}: POOLCTL_NODE_ADDRESS={host}: the stand-in listens on 127.0.0.0/8 only")
    speed = _env_float("POOLCTL_SANDBOX_SPEED", 1.0) or 1.0
    start_s = _env_float("POOLCTL_ENGINE_START_S", 0.0)
    slowdown = _env_float("POOLCTL_ENGINE_SLOWDOWN", 1.0)
    if not 0.1 <= slowdown <= 100:
        sys.exit(f"{PROG}: POOLCTL_ENGINE_SLOWDOWN={slowdown:g}: give 0.1 to 100")
    itype = os.environ.get("POOLCTL_NODE_INSTANCE_TYPE", "p5.48xlarge")
    try:
        facts = json.loads(os.environ.get("POOLCTL_SANDBOX_MODEL") or "{}")
    except ValueError:
        sys.exit(f"{PROG}: POOLCTL_SANDBOX_MODEL is not JSON")
    try:
        m = serving_model(args, itype, facts if isinstance(facts, dict) else None)
    except UsageError as e:
        sys.exit(f"{PROG}: {e}")
    if slowdown != 1.0:
        m = slowed(m, slowdown)
    load_format = str(args.others.get("load-format") or "auto")
    if load_format == streamer.LOAD_FORMAT or args.model.startswith(streamer.SCHEMES):
        try:
            if load_format != streamer.LOAD_FORMAT:
                raise streamer.StreamError(f"--model {args.model}: an object store's folder "
                                           "loads with --load-format runai_streamer")
            streamer.check_extra_config(
                str(args.others["model-loader-extra-config"])
                if "model-loader-extra-config" in args.others else None)
            if args.model.startswith(streamer.SCHEMES):
                got = streamer.stream(args.model, os.environ)
                print(f"INFO Loading weights with the Run:ai Model Streamer from {args.model} "
                      f"as {got.identity}: {got.objects} objects, {got.bytes} bytes", flush=True)
        except streamer.StreamError as e:
            sys.exit(f"{PROG}: ValueError: {e}")
    keys = args.api_keys or tuple(k for k in [os.environ.get("VLLM_API_KEY")] if k)
    version, _ = known_flags()
    print(f"INFO vLLM API server version {version} (poolctl stand-in): {args.model_name}, "
          f"TP {args.tensor_parallel_size} x DP {args.data_parallel_size} on {itype}, "
          f"KV cache {m.kv_tokens} tokens per replica, speed x{speed:g}"
          + (f", steps x{slowdown:g} the model's" if slowdown != 1.0 else ""), flush=True)
    start_s += compile_cache(_env_float("POOLCTL_ENGINE_COMPILE_MISS_S", 0.0))
    await asyncio.sleep(start_s / speed)
    live = Live(m, args.data_parallel_size, speed, args.enable_prefix_caching, args.block_size)
    server = Server(args, live, keys, m.max_model_len)
    from aiohttp import web  # noqa: PLC0415 - the server process only

    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, args.port, backlog=1024).start()
    print(f"INFO Started server process on http://{host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    driver = asyncio.create_task(live.run())
    await stop.wait()
    driver.cancel()
    await runner.cleanup()


def main() -> None:
    asyncio.run(serve(sys.argv[1:]))


if __name__ == "__main__":
    main()
