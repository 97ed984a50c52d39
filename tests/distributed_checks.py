"""Checks that need several ranks: run as ``mpiexec -n 2 python tests/distributed_checks.py``
(tests/test_distributed.py does). Each check prints ``PASS <name> rank <r>``; a
failure raises, which aborts the whole job (a non-zero exit code).

The single-process reference is computed on every rank, on the full batch, with
the eager engine; the ranks each take their half of the batch through DDP.
"""
from __future__ import annotations

import sys

import numpy as np

import compiled_autograd as ca
import compiled_autograd.distributed as dist
from compiled_autograd.distributed.algorithms import (allreduce_hook, fp16_compress_hook,
                                                      noop_hook)
from compiled_autograd.distributed.world import all_gather_object
from compiled_autograd.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
assert WORLD == 2, "run with mpiexec -n 2"
BATCH = 8
DATA = np.random.default_rng(0).standard_normal((BATCH, 6)).astype(np.float32)
TARGET = np.random.default_rng(1).standard_normal((BATCH, 3)).astype(np.float32)
MINE = slice(RANK * BATCH // WORLD, (RANK + 1) * BATCH // WORLD)


def passed(name):
    print(f"PASS {name} rank {RANK}", flush=True)


def mlp(seed):
    ca.manual_seed(seed)
    return ca.nn.Sequential(ca.nn.Linear(6, 16), ca.nn.Tanh(), ca.nn.Linear(16, 16),
                            ca.nn.Tanh(), ca.nn.Linear(16, 3))


def loss_of(model, rows):
    out = model(ca.tensor(DATA[rows]))
    return ((out - ca.tensor(TARGET[rows])) ** 2).mean()


def backward(loss, backend):
    if backend == "eager":
        loss.backward()
    else:
        with ca.compiled_backward(backend=backend):
            loss.backward()


def reference(model):
    """Gradients of a copy of ``model`` on the full batch, single process, eager."""
    ref = mlp(0)
    ref.load_state_dict(model.state_dict())
    loss_of(ref, slice(None)).backward()
    return [p.grad.numpy() for p in ref.parameters()]


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def same_on_every_rank(arrays):
    blobs = all_gather_object([a.tobytes() for a in arrays])
    return all(b == blobs[0] for b in blobs)


def expect_error(fn, *needles, exc=RuntimeError):
    try:
        fn()
    except exc as e:
        for n in needles:
            assert n in str(e), f"{n!r} not in {e}"
        return str(e)
    raise AssertionError(f"no {exc.__name__} raised")


# ---------------------------------------------------------------- collectives

def check_collectives():
    t = ca.tensor([1.0, 2.0]) * (RANK + 1)
    dist.all_reduce(t)
    assert t.numpy().tolist() == [3.0, 6.0]
    t = ca.tensor([1.0, 2.0]) * (RANK + 1)
    dist.all_reduce(t, op="avg")
    assert t.numpy().tolist() == [1.5, 3.0]
    t = ca.tensor([float(RANK)] * 3)
    work = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
    assert work.wait() is t and t.numpy().tolist() == [1.0] * 3
    b = ca.tensor([[RANK, RANK + 10.0]])
    dist.broadcast(b, src=1)
    assert b.numpy().tolist() == [[1.0, 11.0]]
    v = ca.ones(4, 4) * (RANK + 1)
    col = v[:, 1]                      # not contiguous: written back in place
    dist.all_reduce(col)
    assert col.numpy().tolist() == [3.0] * 4, col.numpy()
    assert v.numpy()[:, 1].tolist() == [3.0] * 4 and v.numpy()[0, 0] == RANK + 1
    dist.barrier()
    before = ca.tensor([1.0, 2.0])
    expect_error(lambda: dist.all_reduce(before, op="max"), "op must be", exc=ValueError)
    expect_error(lambda: dist.all_reduce(ca.from_numpy(np.arange(3)), op="avg"),
                 "floating-point")
    expect_error(lambda: dist.broadcast(before, src=5), "src", exc=ValueError)
    expect_error(lambda: dist.init_process_group(), "twice")
    assert before.numpy().tolist() == [1.0, 2.0]
    passed("collectives")


# ---------------------------------------------------------------- DDP

def check_construction_broadcasts():
    model = mlp(seed=100 + RANK)           # each rank starts differently
    model.register_buffer("steps", ca.tensor([float(RANK)]))
    DDP(model)
    assert same_on_every_rank([p.detach().numpy() for p in model.parameters()])
    assert model.steps.numpy().tolist() == [0.0]
    assert list(model.state_dict())[0] == "steps"   # torch: own state before children
    passed("construction_broadcasts")


def check_construction_errors():
    """torch's test_ddp_model_diff_shape_across_ranks / _num_params_across_ranks and
    test_DistributedDataParallel_requires_grad: errors on every rank, nothing hangs."""
    ca.manual_seed(0)
    expect_error(lambda: DDP(ca.nn.Linear(3, 2 + RANK)), "DDP expects same model across all "
                 "ranks", "weight [", f"on rank {RANK}")
    layers = [ca.nn.Linear(3, 3) for _ in range(1 + RANK)]
    expect_error(lambda: DDP(ca.nn.Sequential(*layers)), "DDP expects same model across all "
                 f"ranks, but Rank {RANK} has {2 + 2 * RANK} params, while rank {1 - RANK} has "
                 f"inconsistent {4 - 2 * RANK} params.")
    frozen = ca.nn.Linear(3, 3)
    for p in frozen.parameters():
        p.requires_grad_(False)
    expect_error(lambda: DDP(frozen), "DistributedDataParallel is not needed when a module "
                 "doesn't have any parameter that requires a gradient.")
    expect_error(lambda: DDP(mlp(0), bucket_cap_mb=0), "bucket_cap_mb", exc=ValueError)
    ddp = DDP(mlp(0))
    assert list(ddp.state_dict())[0] == "module.0.weight" and ddp.module is not None
    passed("construction_errors")


class Tied(ca.nn.Module):
    """One Linear used twice (torch's test_ddp_shared_grad_acc_unused_params' cousin):
    its parameters get one gradient, the sum of both uses."""

    def __init__(self):
        super().__init__()
        ca.manual_seed(0)
        self.inp = ca.nn.Linear(6, 4)
        self.shared = ca.nn.Linear(4, 4)

    def forward(self, x):
        return self.shared(self.shared(self.inp(x).tanh()).tanh())


def check_shared_parameters():
    for backend in ("eager", "c"):
        model = Tied()
        ddp = DDP(model, bucket_cap_mb=0.00001)
        for _ in range(2):
            ddp.zero_grad()
            backward((ddp(ca.tensor(DATA[MINE])) ** 2).mean(), backend)
        ref = Tied()
        (ref(ca.tensor(DATA)) ** 2).mean().backward()
        assert max(rel(p.grad.numpy(), r.grad.numpy())
                   for p, r in zip(model.parameters(), ref.parameters())) <= 1e-6
    passed("shared_parameters")


def check_gradients_equal_full_batch():
    """Every backend, several steps each (the learned buckets and a cache hit)."""
    model = mlp(0)
    ddp = DDP(model, bucket_cap_mb=0.0002)   # several buckets
    worst = {}
    for backend in ("eager", "python", "c"):
        ca.reset_compiled_autograd()
        for _ in range(3):
            ddp.zero_grad()
            backward(loss_of(ddp, MINE), backend)
            ref = reference(model)
            worst[backend] = max([worst.get(backend, 0.0)] + [
                rel(p.grad.numpy(), r) for p, r in zip(model.parameters(), ref)])
        if backend != "eager":
            stats = ca.compiled_autograd_stats()
            assert stats["cache_hits"] >= 1, stats
    assert max(worst.values()) <= 1e-6, worst
    assert len(ddp.bucket_layout()) >= 3, ddp.bucket_layout()
    print(f"rank {RANK} max relative difference from the full batch: {worst}", flush=True)
    passed("gradients_equal_full_batch")


def check_training_identical_after_5_steps():
    for backend in ("eager", "c"):
        model, single = mlp(0), mlp(0)
        ddp = DDP(model, bucket_cap_mb=0.001)
        for _ in range(5):
            for m, rows, net in ((ddp, MINE, model), (single, slice(None), single)):
                m.zero_grad()
                backward(loss_of(m, rows), backend if m is ddp else "eager")
                with ca.no_grad():
                    for p in net.parameters():
                        p.sub_(p.grad * 0.1)
        params = [p.detach().numpy() for p in model.parameters()]
        assert same_on_every_rank(params)
        diff = max(rel(a, p.detach().numpy()) for a, p in zip(params, single.parameters()))
        assert diff <= 1e-5, diff
    passed("training_identical_after_5_steps")


def check_no_sync():
    model = mlp(0)
    ddp = DDP(model)
    first, second = slice(RANK * 2, RANK * 2 + 2), slice(4 + RANK * 2, 4 + RANK * 2 + 2)
    with ddp.no_sync():
        backward(loss_of(ddp, first), "python")
    local = [p.grad.numpy().copy() for p in model.parameters()]
    assert not same_on_every_rank(local)        # nothing was communicated
    backward(loss_of(ddp, second), "python")
    # the sum over both micro-batches of every rank's mean losses, averaged over the ranks
    ref = mlp(0)
    ref.load_state_dict(model.state_dict())
    for rows in ((0, 2), (2, 4), (4, 6), (6, 8)):
        loss_of(ref, slice(*rows)).backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        assert rel(p.grad.numpy(), r.grad.numpy() / 2) <= 1e-6
    passed("no_sync")


class Branchy(ca.nn.Module):
    """``used_by``: which ranks use the ``extra`` layer; ``never`` is used by none."""

    def __init__(self, used_by):
        super().__init__()
        ca.manual_seed(0)
        self.body = ca.nn.Linear(6, 3)
        self.extra = ca.nn.Linear(6, 3)
        self.never = ca.nn.Linear(6, 3)
        self.used_by = used_by

    def forward(self, x):
        out = self.body(x)
        if RANK in self.used_by:
            out = out + self.extra(x)
        return out


def branchy_loss(ddp):
    return (ddp(ca.tensor(DATA[MINE])) ** 2).mean()


def check_unused_parameters():
    for backend in ("eager", "python", "c"):
        # find_unused_parameters=True: rank-dependent control flow works
        model = Branchy(used_by=(0,))
        ddp = DDP(model, find_unused_parameters=True)
        for _ in range(2):
            ddp.zero_grad()
            backward(branchy_loss(ddp), backend)
        assert model.never.weight.grad is None and model.never.bias.grad is None
        local = Branchy(used_by=(0,))
        local.load_state_dict(model.state_dict())
        if RANK == 0:
            (local(ca.tensor(DATA[MINE])) ** 2).mean().backward()
            mine = local.extra.weight.grad.numpy()
        else:
            mine = np.zeros(model.extra.weight.shape, np.float32)
        theirs = all_gather_object(mine)
        expect = (theirs[0] + theirs[1]) / 2
        assert rel(model.extra.weight.grad.numpy(), expect) <= 1e-6
        assert same_on_every_rank([p.grad.numpy() for p in model.parameters()
                                   if p.grad is not None])

        # find_unused_parameters=False: a clear error on every rank, naming them
        for used_by in ((0, 1), (0,)):
            model = Branchy(used_by=used_by)
            ddp = DDP(model)
            message = expect_error(lambda: backward(branchy_loss(ddp), backend),
                                   "unused", "never.weight", "find_unused_parameters=True")
            if used_by == (0,):
                assert "rank 1: extra.weight" in message, message
            ddp.zero_grad()
    passed("unused_parameters")


def check_layout_differs():
    """Buckets that differ between ranks (here: another bucket_cap_mb on rank 1)
    would pair all-reduces of different sizes: an error on every rank instead."""
    model = mlp(0)
    ddp = DDP(model, bucket_cap_mb=0.0002 if RANK == 0 else 25)
    expect_error(lambda: backward(loss_of(ddp, MINE), "python"),
                 "gradient buckets differ", "rank 0: [['4.bias', '4.weight', '2.bias'], ['2.weight']",
                 "rank 1: [['4.bias', '4.weight', '2.bias', '2.weight', '0.bias', '0.weight']]")
    passed("layout_differs")


def check_comm_hooks():
    grads = {}
    for name, hook in (("default", None), ("allreduce", allreduce_hook),
                       ("fp16", fp16_compress_hook), ("noop", noop_hook)):
        model = mlp(0)
        ddp = DDP(model, bucket_cap_mb=0.0002)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        for _ in range(2):
            ddp.zero_grad()
            backward(loss_of(ddp, MINE), "python")
        grads[name] = [p.grad.numpy() for p in model.parameters()]
    ref = reference(mlp(0))
    for name in ("default", "allreduce"):
        assert max(rel(g, r) for g, r in zip(grads[name], ref)) <= 1e-6
    fp16 = max(rel(g, r) for g, r in zip(grads["fp16"], ref))
    assert 0 < fp16 <= 2e-3, fp16
    local = mlp(0)
    loss_of(local, MINE).backward()
    assert all(rel(g, p.grad.numpy()) <= 1e-6 for g, p in zip(grads["noop"], local.parameters()))

    seen = []

    def custom(state, bucket):
        state.append((bucket.index(), bucket.is_last(), len(bucket.parameters())))
        flat = bucket.buffer()
        assert flat.numpy().size == sum(g.numpy().size for g in bucket.gradients())
        dist.all_reduce(flat, op="avg")
        return flat
    model = mlp(0)
    ddp = DDP(model, bucket_cap_mb=0.0002)
    ddp.register_comm_hook(seen, custom)
    expect_error(lambda: ddp.register_comm_hook(seen, custom), "only be called once")
    ddp.zero_grad()
    backward(loss_of(ddp, MINE), "c")
    n = len(ddp.bucket_layout())
    assert [s[0] for s in seen] == list(range(n)) and [s[1] for s in seen] == \
        [False] * (n - 1) + [True], seen
    assert max(rel(p.grad.numpy(), r) for p, r in zip(model.parameters(), ref)) <= 1e-6

    def wrong(state, bucket):
        return ca.zeros(3)
    model = mlp(0)
    ddp = DDP(model)
    ddp.register_comm_hook(None, wrong)
    expect_error(lambda: backward(loss_of(ddp, MINE), "eager"), "comm hook returned")
    passed("comm_hooks")


def check_broadcast_buffers():
    model = mlp(0)
    model.register_buffer("scale", ca.tensor([2.0]))
    ddp = DDP(model)
    if RANK == 1:
        model.scale._data[...] = 5.0
    ddp(ca.tensor(DATA[MINE]))             # training forward: rank 0's buffers again
    assert model.scale.numpy().tolist() == [2.0]
    quiet = DDP(mlp(0), broadcast_buffers=False)
    quiet.module.register_buffer("b", ca.tensor([float(RANK)]))
    quiet(ca.tensor(DATA[MINE]))
    assert quiet.module.b.numpy().tolist() == [float(RANK)]
    with ca.no_grad():                     # a forward without a backward never blocks
        for _ in range(RANK + 1):
            ddp.eval()(ca.tensor(DATA[MINE]))
    ddp.train()
    passed("broadcast_buffers")


def check_graph_nodes():
    """The buckets' all-reduces are nodes of the compiled backward, each right
    after its bucket's last gradient; the wait comes after the last one."""
    model = mlp(0)
    ddp = DDP(model, bucket_cap_mb=0.0002)
    for _ in range(2):                      # the second backward uses the learned buckets
        ddp.zero_grad()
        backward(loss_of(ddp, MINE), "python")
    g = ca.trace_backward(loss_of(ddp, MINE))
    ddp.reducer.state = None                # traced only: nothing ran
    nodes = g.graph.nodes
    names = [n.name for n in nodes]
    layout = ddp.reducer.buckets
    params = list(model.parameters())
    for b, members in enumerate(layout):
        at = names.index(f"bucket_{b}_allreduce")
        node = nodes[at]
        assert node.op == "call_hook" and node.target == "post_acc_grad_hook"
        leaf = node.args[1]
        assert tuple(leaf.meta["shape"]) == params[members[-1]].shape
        # right after the accumulation of that gradient: only other hooks between
        acc = max(i for i in range(at) if nodes[i].op == "call_hook"
                  and nodes[i].target == "accumulate_grad")
        assert nodes[acc].args[0] is leaf, (nodes[acc].name, node.name)
        assert all(n.op != "call_function" or n.target == "getitem" for n in nodes[acc:at])
    assert names.index("wait_buckets") > max(names.index(f"bucket_{b}_allreduce")
                                             for b in range(len(layout)))
    if RANK == 0:
        print("\n".join(line for line in g.code.splitlines() if "bucket" in line), flush=True)
    passed("graph_nodes")


def check_update_in_backward():
    """``ca.optim.in_backward`` under DDP: each update waits for its bucket's
    all-reduce (it uses the averaged gradient), so the ranks' parameters stay
    identical and equal one process training on the full batch."""
    for backend in ("eager", "python", "c"):
        ca.reset_compiled_autograd()
        model, single = mlp(0), mlp(0)
        ddp = DDP(model, bucket_cap_mb=0.0002)        # several buckets
        opt = ca.optim.in_backward(ca.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9))
        ref = ca.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
        for _ in range(4):
            backward(loss_of(ddp, MINE), backend)
            assert all(p.grad is None for p in model.parameters())
            ref.zero_grad()
            loss_of(single, slice(None)).backward()
            ref.step()
        params = [p.detach().numpy() for p in model.parameters()]
        assert same_on_every_rank(params)
        diff = max(rel(a, p.detach().numpy()) for a, p in zip(params, single.parameters()))
        assert diff <= 1e-5, (backend, diff)
        assert len(ddp.bucket_layout()) >= 3
        opt.remove()
    passed("update_in_backward")


CHECKS = [check_collectives, check_construction_broadcasts, check_construction_errors,
          check_shared_parameters, check_gradients_equal_full_batch,
          check_training_identical_after_5_steps, check_no_sync, check_unused_parameters,
          check_layout_differs, check_comm_hooks, check_broadcast_buffers, check_graph_nodes,
          check_update_in_backward]

if __name__ == "__main__":
    only = sys.argv[1:]
    for check in CHECKS:
        if not only or check.__name__ in only:
            check()
    dist.barrier()
    print(f"ALL DONE rank {RANK}", flush=True)
    dist.destroy_process_group()
