"""Jobs that must end, not hang: ``mpiexec -n 2 python tests/distributed_failures.py MODE``
(tests/test_distributed.py runs each and bounds it with a timeout).

- ``raise``: rank 1 raises inside a compiled ("c") backward while rank 0 waits for
  its buckets; the job ends with rank 1's traceback.
- ``diverge``: rank 1's forward skips a layer (find_unused_parameters=False): the
  ranks' check before the first all-reduce raises, on every rank, naming it.
- ``timeout``: rank 1 never reaches an all-reduce; rank 0's times out naming it.
"""
from __future__ import annotations

import sys
import time

import numpy as np

import compiled_autograd as ca
import compiled_autograd.distributed as dist
from compiled_autograd.nn.parallel import DistributedDataParallel as DDP

MODE = sys.argv[1]
dist.init_process_group(timeout=3.0 if MODE == "timeout" else None)
RANK = dist.get_rank()


class Net(ca.nn.Module):
    def __init__(self):
        super().__init__()
        ca.manual_seed(0)
        self.first = ca.nn.Linear(4, 4)
        self.second = ca.nn.Linear(4, 2)

    def forward(self, x):
        h = self.first(x).tanh()
        if MODE == "diverge" and RANK == 1:
            return h.sum(dim=1, keepdim=True)
        return self.second(h)


ddp = DDP(Net())
x = ca.tensor(np.ones((3, 4), np.float32) * (RANK + 1))
for step in range(3):
    ddp.zero_grad()
    loss = (ddp(x) ** 2).mean()
    if MODE == "raise" and RANK == 1 and step == 1:
        def fail(grad):
            raise ValueError("rank 1 fails on purpose, inside its backward")
        loss.register_hook(fail)
    if MODE == "timeout" and RANK == 1 and step == 1:
        time.sleep(60)          # never reaches this step's all-reduces (killed first)
    with ca.compiled_backward(backend="c"):
        loss.backward()
    print(f"rank {RANK} step {step} done", flush=True)
print(f"rank {RANK} finished: this should not happen in mode {MODE}", flush=True)
