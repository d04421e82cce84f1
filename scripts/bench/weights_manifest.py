#!/usr/bin/env python3
"""Benchmark of `poolctl weights manifest`: SHA-256 throughput over a folder shaped like a
model's (a few large shards), with one hashing thread against poolctl's default
(`poolctl.weights.HASH_THREADS`). The files are written once to a temporary folder (in the
page cache after that, so this measures hashing, not the disk).

    source scripts/env.sh && python scripts/bench/weights_manifest.py [--gib 2] [--shards 8]

Why: a 70B model's weights are ~141 GB; the manifest is hashed once per model version before
the upload, and each node hashes its copy again (the boot script's check runs the same reads
and digests on 64 threads at most). Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from poolctl import weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="total size of the shards")
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()
    size = int(args.gib * (1 << 30) / args.shards)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        block = os.urandom(1 << 20)
        for i in range(args.shards):
            with (root / f"model-{i + 1:05d}-of-{args.shards:05d}.safetensors").open("wb") as f:
                for _ in range(size >> 20):
                    f.write(block)
        total = args.shards * (size >> 20 << 20)
        print(f"{args.shards} shards, {total / 1e9:.2f} GB, {os.cpu_count()} CPUs")
        for threads in sorted({1, weights.HASH_THREADS}):
            weights.HASH_THREADS = threads
            t0, c0 = time.monotonic(), time.process_time()
            weights.build_manifest(root)
            wall, cpu = time.monotonic() - t0, time.process_time() - c0
            print(f"  {threads:2d} threads: {wall:6.2f} s wall, {cpu:6.2f} s CPU, "
                  f"{total / 1e9 / wall:5.2f} GB/s")


if __name__ == "__main__":
    main()
