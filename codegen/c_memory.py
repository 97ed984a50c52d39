"""Where the C backend's buffers live, decided once the graph has been emitted:
output arrays allocated as late as the callbacks allow, and the arena plan with
its blocks (``compiled_autograd.codegen.arena``). (A loop writing over a dying input is decided
before its C is rendered: ``Emitter.reuse_dying_input``.) Each pass reads the
program (``compiled_autograd.codegen.c.CProgram``) and appends the pointer assignments it needs to
``stmts`` as ``c_text.Stmt`` records."""
from __future__ import annotations

from compiled_autograd.codegen import arena as arena_plan
from compiled_autograd.codegen.c_layout import ctype
from compiled_autograd.codegen.c_text import Stmt


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
            text = f"{s.name} = ({ctype(s.dtype)} *)CA_DATA(out[{s.index}]);"
            stmts.append(Stmt(site.step, "", text, frozenset((s,)), frozenset((s,))))
    return lazy


def plan_arena_blocks(prog, stmts):
    """The arena plan (``compiled_autograd.codegen.arena``), with the callbacks' steps as its cuts.
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
            stmts.append(Stmt(prog.cuts[opened - 1], "", f"{s.name} = {arena_pointer(prog, s)};",
                              frozenset((s,)), frozenset((s,))))
    return late


def fold_releases(prog, stmts):
    """A release callback that has nothing else to do (no output to allocate, no
    arena block to open or close) is left out of the C: the next callback does
    its work first, in the same order (flush the accumulations before it, drop
    its arrays). Between the two, only C runs, which allocates nothing Python
    sees, so every allocation and free happens as before, for one call fewer.
    The cuts, and so the arena plan, stay as planned."""
    pending = []
    for site in _in_order(prog.sites):
        if site.kind == "release" and not (site.alloc or site.open_blocks or
                                           site.close_blocks):
            pending.append(site)
        else:
            site.early, pending = pending, []
    folded = {site.index for site in prog.sites for site in site.early}
    stmts[:] = [st for st in stmts if _release_site(st) not in folded]


def _release_site(stmt):
    """The index of the release callback a statement is, or None."""
    text = stmt.text
    if text.startswith("if (ca_call_back(cb, ") and "/* release:" in text:
        return int(text[len("if (ca_call_back(cb, "):text.index(",", len("if (ca_call_back(cb, "))])
    return None


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
