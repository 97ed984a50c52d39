"""Why selective checkpointing of the GELU MLP (benchmarks/memory.py, "keep linear")
peaks above no checkpointing: the peak bytes of both (16 layers, as memory.py),
and, for 3 layers, the arrays live when the backward allocates its first
gradient, by name, in both modes.

    python docs/examples/selective_peak.py
"""
from collections import Counter

import compiled_autograd as ca
from compiled_autograd.examples import build


def profile(mode, layers):
    ex = build("mlp", checkpoint=mode, layers=layers, width=256, batch=256, activation="gelu")
    with ca.memory.profile(tracemalloc_witness=False) as prof:
        ex.loss().backward()
    return prof


def live_at_first_gradient(prof):
    """(name, category) -> count of the arrays live when the first gradient array
    of more than a few bytes is allocated."""
    live = {}
    for e in prof.timeline:
        if e.action == "alloc":
            if e.category == "gradient" and e.bytes > 8 and e.name != "grad_root":
                return Counter(live.values())
            live[e.storage] = (e.name, e.category)
        elif e.action == "free":
            live.pop(e.storage, None)
        elif e.storage in live:
            live[e.storage] = (live[e.storage][0], e.category)
    raise RuntimeError("no gradient allocated")


def main():
    peaks = {mode: profile(mode, 16).peak_bytes for mode in ("none", "selective")}
    print(f"16 layers: peak {peaks['none']:,} B with no checkpointing, "
          f"{peaks['selective']:,} B selective, difference "
          f"{peaks['selective'] - peaks['none']:,} B (one 256x256 float32 array: 262,144 B)")
    for mode in ("none", "selective"):
        live = live_at_first_gradient(profile(mode, 3))
        print(f"3 layers, {mode:<9}: " + ", ".join(f"{n} {name} ({cat})" for (name, cat), n
                                                   in sorted(live.items())))


if __name__ == "__main__":
    main()
