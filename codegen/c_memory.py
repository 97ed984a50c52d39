"""Where the C backend's buffers live, decided once the graph has been emitted:
merged in-place buffers, output arrays allocated as late as the callbacks allow,
and the arena plan with its blocks (``codegen.arena``). Each pass reads the
program (``codegen.c.CProgram``) and appends the C statements it needs to
``stmts`` as (step, source, text)."""
from __future__ import annotations

from codegen import arena as arena_plan
from codegen.c_layout import ctype


def reuse_dying_inputs(prog, stmts, loops):
    """An elementwise loop may write its result over an arena input that dies
    in that loop, when it reads every element of that input exactly where it
    writes the same element of the result (out[i] = f(a[i], ...)). The two
    buffers become one, which lowers the arena (the planner never has to hold
    both). Only when that loop is the node's only statement and only loop: a node
    that first fills its result (slice_backward's zeros, as_strided_scatter's
    base copy, in the same statement as its scatter) would otherwise overwrite
    the input before the loop reads it. ``loops``: (step, out, leaves,
    accumulate) per elementwise loop."""
    alias: dict = {}
    per_step: dict = {}
    for s, _, _ in stmts:
        per_step[s] = per_step.get(s, 0) + 1
    loops_at: dict = {}
    for s, *_ in loops:
        loops_at[s] = loops_at.get(s, 0) + 1

    def root(st):
        while st in alias:
            st = alias[st]
        return st

    for step, out, leaves, accumulate in loops:
        b = out.storage
        if (accumulate or b.kind != "arena" or b.first != step or b in alias
                or per_step.get(step) != 1 or loops_at[step] != 1):
            continue
        for offset, strides, a in leaves:
            a = root(a)
            if (a is b or a.kind != "arena" or a.last != step or a.dtype != b.dtype
                    or a.nbytes != b.nbytes or not isinstance(a.nbytes, int)):
                continue
            same = all(o == out.offset and list(st) == list(out.strides)
                       for o, st, s in leaves if root(s) is a)
            if same and out.offset == 0 and out.is_contiguous():
                alias[b] = a
                a.last = max(a.last, b.last)
                break
    # lifetimes of merged buffers: the union
    for b in alias:
        r = root(b)
        r.last = max(r.last, b.last)
    kept = [s for s in prog.arena_storages if s not in alias]
    prog.arena_index = {s: i for i, s in enumerate(kept)}
    prog.arena_index.update({b: prog.arena_index[root(b)] for b in alias})
    prog.arena_storages = kept
    return {b.name: root(b).name for b in alias}


def allocate_outputs_late(prog, stmts):
    """An output array (a gradient for ``.grad``) is allocated by Python at the
    last callback before its first write, not all at the start: with hooks
    (a checkpointed backward) gradients appear as the backward reaches them,
    as in the Python backend. Returns the storages allocated late."""
    sites = _in_order(prog.sites)
    lazy = set()
    for s in prog.out_storages:
        before = [site for site in sites if site.step < s.first]
        if before:
            site = before[-1]
            site.alloc.append(s)
            lazy.add(s)
            # after the callback itself (same step, emitted later: stable sort)
            stmts.append((site.step, "", f"{s.name} = ({ctype(s.dtype)} *)"
                                              f"CA_DATA(out[{s.index}]);"))
    return lazy


def plan_arena_blocks(prog, stmts):
    """The arena plan (``codegen.arena``), with the callbacks' steps as its cuts.
    A buffer in a block opened at a callback gets its pointer after that
    callback, which allocated the block. Returns those buffers. (A dynamic
    graph's plan depends on its sizes: the runner makes it per call, with
    the same blocks, which depend on steps only.)"""
    sites = _in_order(prog.sites)
    prog.cuts = [site.step for site in sites]
    assert len(set(prog.cuts)) == len(prog.cuts), "two callbacks at one step"
    buffers = [(s.nbytes if not prog.dynamic else 0, s.first, s.last)
               for s in prog.arena_storages]
    plan = arena_plan.plan(buffers, prog.cuts, fill=not prog.dynamic)
    prog.plan = None if prog.dynamic else plan
    prog.block_of, prog.windows = plan.block_of, plan.windows
    whole = (0, len(prog.cuts))
    prog.call_block = prog.windows.index(whole) if whole in prog.windows else None
    for k, (opened, closed) in enumerate(prog.windows):
        if k != prog.call_block:
            if opened > 0:
                sites[opened - 1].open_blocks.append(k)
            if closed < len(sites):
                sites[closed].close_blocks.append(k)
    late = set()
    for i, s in enumerate(prog.arena_storages):
        opened = prog.windows[prog.block_of[i]][0]
        if opened > 0:
            late.add(s)
            stmts.append((prog.cuts[opened - 1], "", f"{s.name} = {arena_pointer(prog, s)};"))
    return late


def arena_pointer(prog, s):
    """C for the address of arena buffer ``s``: its block's base plus its offset.
    The block live for the whole call is ``arena``; any other is an array
    Python allocated, read from ``out[]`` after the output arrays."""
    i = prog.arena_index[s]
    k = prog.block_of[i]
    base = "arena" if k == prog.call_block else f"CA_DATA(out[{len(prog.out_storages) + k}])"
    offset = f"offsets[{i}]" if prog.dynamic else str(prog.plan.offsets[i])
    return f"({ctype(s.dtype)} *)({base} + {offset})"


def _in_order(sites):
    """The callback sites in the order the C reaches them."""
    return sorted(sites, key=lambda site: site.step)
