"""Per-seed SAC update throughput when N seeds train as members of the same batched networks.

    python -m benchmarks.seeds_throughput [--threads 2] [--device cpu] [--seeds 1 2 4 8]

For each N, one agent with N seeds does ``--updates`` updates per call (one env step at that
replay ratio); prints aggregate and per-seed updates/s and the per-seed throughput relative to
N = 1 (> 1 means batching seeds beats running them one after another).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import build, interleaved_medians, sac_config, time_updates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--updates", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    setups = {n: build(sac_config(precision=args.precision, compile=args.compile), seeds=n,
                       device=args.device) for n in args.seeds}
    for agent, buf in setups.values():
        time_updates(agent, buf, args.batch, args.updates, calls=2)
    t = interleaved_medians(
        {n: (lambda a=a, b=b: time_updates(a, b, args.batch, args.updates)) for n,
         (a, b) in setups.items()}, args.repeats
    )
    first = args.seeds[0]
    base = first / t[first]
    print(f"device={args.device} threads={args.threads} precision={args.precision} compile={args.compile} "
          f"batch={args.batch} 2x256, {args.updates} updates per call")
    for n, sec in t.items():
        agg = n / sec
        print(f"  N={n:<3} per-seed {1.0 / sec:8.1f} updates/s   aggregate {agg:9.1f} updates/s   "
              f"aggregate vs N={first}: {agg / base:5.2f}x")


if __name__ == "__main__":
    main()
