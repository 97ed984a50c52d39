"""The caching allocator (runtime/pool.c) over a few training steps of the bundled
transformer: minor page faults per step with it and without it (a second process
with CA_POOL=0), what it holds, and empty_cache.

    python docs/examples/caching_allocator.py
"""
import os
import resource
import subprocess
import sys

import numpy as np

import compiled_autograd as ca
from compiled_autograd.examples import build


def steps(n=4):
    ex = build("transformer")
    params = list(ex.parameters())
    rows = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        loss = ex.loss()
        with ca.compiled_backward(backend="c"):
            loss.backward()
        for p in params:
            p.grad = None
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        rows.append((faults, ca.memory.cache_stats()))
    return rows


if __name__ == "__main__" and os.environ.get("CA_POOL") == "0":
    print(" ".join(str(faults) for faults, _ in steps()))
    sys.exit()

print("step  page faults  (CA_POOL=0)   in use      kept    hits  misses")
off = subprocess.run([sys.executable, __file__], env=dict(os.environ, CA_POOL="0"),
                     capture_output=True, text=True, check=True).stdout.split()
for k, ((faults, s), faults_off) in enumerate(zip(steps(), off), 1):
    print(f"{k:>4}{faults:>13}{faults_off:>13}{s['in_use'] / 2**20:>8.1f} MB"
          f"{s['cached'] / 2**20:>7.1f} MB{s['hits']:>8}{s['misses']:>8}")
x = ca.tensor(np.ones((256, 256), np.float32), requires_grad=True)
print("a large result's handler:", np._core.multiarray.get_handler_name((x * 2).detach().numpy()))
print("a user's array's handler:", np._core.multiarray.get_handler_name(np.ones((256, 256))))
print(f"empty_cache() freed {ca.memory.empty_cache() / 2**20:.1f} MB;",
      "kept now:", ca.memory.cache_stats()["cached"])
