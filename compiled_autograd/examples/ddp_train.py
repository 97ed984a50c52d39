"""Train the bundled transformer data-parallel over MPI:

    mpiexec -n 2 python -m compiled_autograd.examples.ddp_train

Each rank takes its share of the batch; DistributedDataParallel averages the
gradients inside the compiled backward; rank 0 prints each step's loss over the
whole batch. ``--reference`` trains the same model in one process on the whole
batch (no communication): the printed losses are the same.
"""
from __future__ import annotations

import argparse

import compiled_autograd as ca
import compiled_autograd.distributed as dist    # needs the mpi extra
from compiled_autograd.examples.transformer import _forward, make_transformer
from compiled_autograd.nn.parallel import DistributedDataParallel


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m compiled_autograd.examples.ddp_train",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--backend", default="c", choices=("eager", "python", "c"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--bucket-cap-mb", type=float, default=0.25)
    p.add_argument("--reference", action="store_true",
                   help="one process, the whole batch, no DDP (to compare)")
    return p.parse_args(argv)


def backward(loss, backend):
    if backend == "eager":
        loss.backward()
    else:
        with ca.compiled_backward(backend=backend):
            loss.backward()


def main(argv=None):
    args = parse(argv)
    ex = make_transformer(layers=args.layers, d_model=args.d_model, heads=args.heads,
                          seq=args.seq, batch=args.batch, vocab=args.vocab)
    tokens, targets = ex.inputs["tokens"], ex.inputs["targets"]
    model, rank, world = ex.model, 0, 1
    if not args.reference:
        dist.init_process_group()
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.batch % world:
            raise SystemExit(f"--batch {args.batch} must be divisible by the {world} ranks")
        share = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
        tokens, targets = tokens[share], targets[share]
        model = DistributedDataParallel(ex.model, bucket_cap_mb=args.bucket_cap_mb)
    params = list(ex.model.parameters())
    for step in range(args.steps):
        model.zero_grad()
        loss = _forward(model, tokens, targets)
        backward(loss, args.backend)
        total = ca.tensor([loss.item()])
        if not args.reference:
            dist.all_reduce(total, op="avg")    # equal shares: the whole batch's mean
        with ca.no_grad():
            for p in params:
                p.sub_(p.grad * args.lr)
        if rank == 0:
            print(f"step {step} loss {total.item():.5f}", flush=True)
    if not args.reference:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
