"""The worked example of docs/memory.md: four Linear -> LayerNorm -> GELU blocks,
run plainly, with a checkpoint per block, and with disk offload."""
import compiled_autograd as ca
from compiled_autograd.autograd.graph import save_on_disk
from compiled_autograd.utils.checkpoint import checkpoint

F = ca.nn.functional
ca.manual_seed(0)
blocks = [(ca.nn.Linear(256, 256), ca.nn.LayerNorm(256)) for _ in range(4)]
x = ca.randn(256, 256)


def block(h, lin, ln):
    return F.gelu(ln(lin(h)))


def forward(mode):
    h = x
    for lin, ln in blocks:
        h = checkpoint(block, h, lin, ln) if mode == "checkpoint" else block(h, lin, ln)
    return h.sum()


for mode in ("plain", "checkpoint", "offload"):
    with ca.memory.profile() as prof:
        with save_on_disk() if mode == "offload" else ca.enable_grad():
            loss = forward(mode)
        kept = prof.live_bytes
        loss.backward()
    print(f"== {mode}: kept after forward {kept:,} bytes")
    print(prof.summary())
    for lin, ln in blocks:
        for p in list(lin.parameters()) + list(ln.parameters()):
            p.grad = None
    if mode == "checkpoint":
        recomputed = [e for e in prof.timeline if e.category == "recomputed" and e.action == "alloc"]
        print(f"first recomputed allocations (step, bytes, op): "
              f"{[(e.step, e.bytes, e.name) for e in recomputed[:4]]}")
    print()
