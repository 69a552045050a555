#!/usr/bin/env python3
"""PyTorch (CPU) timings of Mamba's selective scan for rlx-bench's `scan` suite.

The recurrence as mamba_ssm's `selective_scan_ref` writes it (softplus on delta, real A,
variable B and C, the skip D and the gate z): exp(delta A) and delta B u for every step at
once, then a Python loop over the sequence with one einsum per step.

Usage: scan_ref.py --threads T --reps R --batch B --dim D --length L --state N
Prints one JSON line: per-repetition values in G state updates per second (B·D·L·N / t).
"""

import argparse
import json
import statistics
import sys
import time


def main(argv):
    p = argparse.ArgumentParser()
    for name in ("threads", "reps", "batch", "dim", "length", "state"):
        p.add_argument(f"--{name}", type=int, required=True)
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    bs, d, l, n = a.batch, a.dim, a.length, a.state
    u = torch.randn(bs, d, l, generator=g)
    delta = torch.randn(bs, d, l, generator=g)
    A = -torch.exp(torch.randn(d, n, generator=g) * 0.5)
    B = torch.randn(bs, n, l, generator=g)
    C = torch.randn(bs, n, l, generator=g)
    D = torch.randn(d, generator=g)
    z = torch.randn(bs, d, l, generator=g)

    def run():
        with torch.no_grad():
            dl = F.softplus(delta)
            delta_a = torch.exp(torch.einsum("bdl,dn->bdln", dl, A))
            delta_b_u = torch.einsum("bdl,bnl,bdl->bdln", dl, B, u)
            x = u.new_zeros((bs, d, n))
            ys = []
            for i in range(l):
                x = delta_a[:, :, i] * x + delta_b_u[:, :, i]
                ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
            y = torch.stack(ys, dim=2)
            return (y + u * D[None, :, None]) * F.silu(z)

    run()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    work = bs * d * l * n
    values = [work / t / 1e9 for t in times]
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "times_s": times,
                      "values": values, "median": statistics.median(values)}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
