"""The collection walk: the key and the runtime values of a backward.

``collect`` walks the autograd graph and lets every node, in the key's canonical
order (``canonical_order``: the nodes in the order they were made, then the
leaves, then the roots), write its ``compiled_args``, its hooks and its edges into
a ``CompiledNodeArgs`` (compiled_args.py; ``collect_node``). This is all a cache
hit costs before the compiled function runs.
"""
from __future__ import annotations

import operator

import numpy as np

from compiled_autograd.autograd import engine
from compiled_autograd.autograd import hooks as _hooks
from compiled_autograd.autograd.node import AccumulateGrad, PrimBackward
from compiled_autograd.compiled.compiled_args import CompiledNodeArgs


# -------------------------------------------------------------- hooks of a node

def node_hooks(fn):
    """(kind, input_nr, callable) of every hook around ``fn``, in eager's order:
    tensor pre-hooks and retain_grad, node pre-hooks, post-accumulate-grad hooks,
    node post-hooks."""
    d = fn.__dict__
    variable = _hooks.leaf_of(fn)
    if variable is not None and not d and not variable._backward_hooks:
        # (the common case: a leaf whose only hooks are post-accumulate-grad hooks)
        post = variable._post_accumulate_grad_hooks
        if not post:
            return []
        if len(post) == 1:
            (h,) = post.values()
            return [("post_acc_grad_hook", None, h)]
        return [("post_acc_grad_hook", None, h) for h in post.values()]
    out = []
    per_output = d.get("_tensor_pre_hooks")
    if variable is not None and variable._backward_hooks:
        per_output = {0: variable._backward_hooks}
    if per_output:
        for nr, hooks in per_output.items():
            out += [("tensor_pre_hook", nr, h) for h in hooks.values()]
    retains = d.get("_retains_grad")
    if retains:
        retainers = d.setdefault("_retainer_fns", {})
        for nr, refs in retains.items():
            for key, ref in refs.items():
                # One closure per retained tensor, so both walks see the same callable.
                fn_ = retainers.get((nr, key, id(ref)))
                if fn_ is None:
                    fn_ = retainers[(nr, key, id(ref))] = _retainer(ref)
                out.append(("tensor_pre_hook", nr, fn_))
    pre = d.get("_pre_hooks")
    if pre:
        out += [("pre_hook", None, h) for h in pre.values()]
    if variable is not None and variable._post_accumulate_grad_hooks:
        out += [("post_acc_grad_hook", None, h)
                for h in variable._post_accumulate_grad_hooks.values()]
    post = d.get("_post_hooks")
    if post:
        out += [("post_hook", None, h) for h in post.values()]
    return out


def _retainer(ref):
    """retain_grad as a tensor hook that stores the gradient and changes nothing."""
    def retain_grad(grad):
        t = ref()
        if t is not None:
            _hooks.retain(t, grad._data)
    return retain_grad


# -------------------------------------------------------------- the collection walk
#
# The key lists nodes in one canonical order: the nodes that are not AccumulateGrad
# in the order they were made (sequence number), then the leaves' AccumulateGrad nodes in
# the order the nodes before them first point to them, then the roots. An edge
# names its target by distance in that order, (made k nodes earlier, input_nr),
# or as ("leaf", j, input_nr).

def canonical_order(task, roots):
    """(nodes, leaves, edges, position): the non-leaf nodes in creation order, the
    AccumulateGrad nodes in first-reference order, each node's encoded edges, and
    ``position(fn)``: a root's name in the key (its distance from the newest node,
    or ("leaf", j)).

    An edge from node ``i`` to ``nxt`` is encoded as ``(i - rank of nxt,
    input_nr)``, ``("leaf", j, input_nr)`` for an AccumulateGrad (``j`` its
    number, in first-reference order), or None for no edge."""
    nodes = [fn for fn in task.nodes if not fn.accumulates_grad]
    nodes.sort(key=_made)
    rank = {fn: i for i, fn in enumerate(nodes)}
    leaves: dict = {}
    edges = []
    for i, fn in enumerate(nodes):
        encoded = []
        for nxt, nr in fn.next_functions:
            if nxt is None:
                encoded.append(None)
                continue
            r = rank.get(nxt)
            if r is not None:
                encoded.append((i - r, nr))
                continue
            j = leaves.get(nxt)     # (only AccumulateGrad nodes are not ranked)
            if j is None:
                j = leaves[nxt] = len(leaves)
            encoded.append(("leaf", j, nr))
        edges.append(tuple(encoded))
    for (fn, _), _ in roots:
        if fn.accumulates_grad and fn not in leaves:
            leaves[fn] = len(leaves)
    last = len(nodes) - 1

    def position(fn):
        i = rank.get(fn)
        return last - i if i is not None else ("leaf", leaves[fn])
    return nodes, list(leaves), edges, position


_made = operator.attrgetter("_sequence_nr")


def collect(task, roots, record=True):
    """The key and runtime values of this backward, the nodes in the canonical
    order above. Runtime values are found again by identity, so the trace may
    visit in eager's order. ``record=False`` (a cache hit) skips noting where each
    value sits, which only the tracer needs."""
    args = CompiledNodeArgs(record)
    nodes, leaves, edges, position = canonical_order(task, roots)
    exec_info = task.exec_info
    captures = task.captures
    captured_fns = {fn for fn, _ in captures}
    key, collect_prim = args.key, args.collect_prim_node
    for fn, fn_edges in zip(nodes + leaves, edges + [()] * len(leaves)):
        runs = True
        if exec_info is not None:
            # Not every node runs: the key says which (by position) and whether.
            runs = exec_info.get(fn, False)
            if not runs and fn not in captured_fns:
                continue
            key.append(("node", position(fn), runs))
        elif _PLAIN_PRIM_NODES[fn.__class__] and "_hooked" not in fn.__dict__:
            # collect_node's common case, inline: a prim node without hooks
            args.node = fn
            collect_prim(fn)
            key.append(("edges", fn_edges))
            continue
        elif fn.__class__ is AccumulateGrad and "_hooked" not in fn.__dict__:
            # and its other common case: a leaf without hooks
            variable = fn.variable
            if not (variable._backward_hooks or variable._post_accumulate_grad_hooks):
                args.node = fn
                args.collect_leaf(variable, AccumulateGrad)
                key.append(("edges", fn_edges))
                continue
        collect_node(args, fn, fn_edges, runs)
    args.node = None
    collect_roots(args, roots, position)
    if captures:
        # An input the roots do not reach (allow_unused) is captured by no node:
        # its gradient is None. Only its position is part of the key.
        reached = tuple(sorted(((position(fn), nr, tuple(idx))
                                for (fn, nr), idx in captures.items() if fn in task.index),
                               key=repr))
        unreached = tuple(sorted(i for (fn, _), idx in captures.items()
                                 if fn not in task.index for i in idx))
        args.collect(("captures", reached, unreached))
    return args


def collect_roots(args, roots, position) -> None:
    """The roots: where each gradient enters (``position``), its dtype and sizes."""
    grads = [g if type(g) is np.ndarray else np.asarray(g) for _, g in roots]
    args.collect(("roots", tuple([(position(fn), nr, g.dtype)
                                  for ((fn, nr), _), g in zip(roots, grads)])))
    for i, g in enumerate(grads):
        args.collect_sizes((g.shape,), owner=("root", i))


class _PrimNodeClasses(dict):
    """PrimBackward classes -> whether ``collect_node`` of one of their nodes
    without hooks is ``collect_prim_node`` and its edges (it does not override
    ``compiled_args`` and is not user code)."""

    def __missing__(self, cls):
        plain = (issubclass(cls, PrimBackward) and not cls.user_code
                 and cls.compiled_args is PrimBackward.compiled_args)
        self[cls] = plain
        return plain


_PLAIN_PRIM_NODES = _PrimNodeClasses()


def collect_node(args, fn, edges, runs=True):
    """One node's hooks, compiled args and edges."""
    args.node = fn
    traced = False
    if _hooks.has_hooks(fn):
        leaf = _hooks.leaf_of(fn)
        for kind, nr, h in node_hooks(fn):
            if runs or kind == "tensor_pre_hook":
                traced |= args.collect_hook(kind, nr, h, leaf)
    if runs:
        if not traced:    # (a traced hook takes the gradient: nothing is accumulated)
            fn.compiled_args(args)
        if engine.needs_validation(fn):
            # What user code must return: symbolic where dynamic, as the sizes
            # the returned gradients are checked against (tracer.visit).
            args.collect_sizes(engine.expected_shapes(fn), owner=("validate", id(fn)))
        if not fn.holds_only_collected:
            # It may hold values besides the saved variables collected (which a
            # compiled backward releases itself): it is asked to release them.
            args.release_nodes.append(fn)
        args.key.append(("edges", edges))
    args.node = None
