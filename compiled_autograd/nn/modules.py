"""Module, Parameter and the standard layers (torch.nn's behaviour, in small)."""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from compiled_autograd.autograd import random as _random
from compiled_autograd.autograd.grad_mode import no_grad
from compiled_autograd.nn import functional as F
from compiled_autograd.autograd.tensor import Tensor
from compiled_autograd.runtime import memory as _rt_memory


class Parameter(Tensor):
    """A leaf Tensor that a Module registers as a parameter (requires grad)."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        arr = data._data if isinstance(data, Tensor) else np.asarray(data, dtype=np.float32)
        self._init(np.array(arr, order="C", copy=True))
        _rt_memory.on_array(self._data, "Parameter", "parameter")
        self.requires_grad = requires_grad

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class: attributes that are Parameters or Modules are registered, in
    assignment order, so parameters() and state_dict() find them."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign before Module.__init__() call")
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            # as torch: assigning to a buffer's name replaces the buffer
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(Tensor or None expected)")
            self._buffers[name] = value
            object.__setattr__(self, name, value)
            return
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent_buffers_set.discard(name)
        object.__delattr__(self, name)

    def register_buffer(self, name, tensor, persistent=True):
        """A Tensor that belongs to the module's state but is no parameter (running
        statistics, masks): in ``buffers()`` and, if ``persistent``, in
        ``state_dict()``; ``None`` registers the name with no value. As torch's."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError("buffer name can't contain \".\"")
        if name == "":
            raise KeyError("buffer name can't be empty string \"\"")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer "
                            f"'{name}' (Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)
        object.__setattr__(self, name, tensor)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"Module [{type(self).__name__}] is missing the required "
                                  "\"forward\" function")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self, prefix=""):
        seen = set()
        for mod_name, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self, prefix="", recurse=True):
        """(qualified name, buffer) of this module's buffers (and its
        sub-modules' when ``recurse``), each once; a None buffer is skipped."""
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_name, module in modules:
            for name, b in module._buffers.items():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    yield (f"{mod_name}.{name}" if mod_name else name), b

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def _state(self):
        """Name -> parameter or persistent buffer, in torch's order (a module's
        parameters, then its buffers, then its sub-modules')."""
        out = OrderedDict()
        for mod_name, module in self.named_modules():
            prefix = f"{mod_name}." if mod_name else ""
            for name, p in module._parameters.items():
                if p is not None:
                    out.setdefault(prefix + name, p)
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent_buffers_set:
                    out.setdefault(prefix + name, b)
        return out

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad._data[...] = 0

    def state_dict(self):
        """Name -> detached Tensor sharing the storage of a parameter or a
        persistent buffer."""
        return OrderedDict((name, p.detach()) for name, p in self._state().items())

    def load_state_dict(self, state_dict, strict=True):
        own = self._state()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}: "
                               f"Missing key(s): {missing}. Unexpected key(s): {unexpected}.")
        for name, value in state_dict.items():
            if name in own:
                arr = value._data if isinstance(value, Tensor) else np.asarray(value)
                if arr.shape != own[name].shape:
                    raise RuntimeError(f"size mismatch for {name}: copying a param with shape "
                                       f"{list(arr.shape)} from checkpoint, the shape in "
                                       f"current model is {list(own[name].shape)}.")
                with no_grad():
                    own[name]._data[...] = arr
                    own[name]._version_counter.bump()
        return missing, unexpected

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ("\n" + "\n".join(lines) + "\n)" if lines else ")")


def _uniform(shape, bound):
    return _random.generator().uniform(-bound, bound, size=shape).astype(np.float32)


class Linear(Module):
    """y = x W^T + b, initialised as torch does: U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = Parameter(np.ones(shape, np.float32)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(shape, np.float32)) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(_random.generator().standard_normal(
            (num_embeddings, embedding_dim)).astype(np.float32))

    def forward(self, idx):
        return F.embedding(idx, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    def __init__(self, p=0.5):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x
