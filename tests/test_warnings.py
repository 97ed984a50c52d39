"""The next numpy (issue 29, item 16): numpy 2.5 deprecates setting ``arr.shape``
(and ``arr.strides``); the project's code does neither, and the suite fails on a
DeprecationWarning raised from the project's own modules (pyproject.toml,
``filterwarnings``), while one from another package stays a warning."""
import ast
import warnings
from pathlib import Path

import numpy as np
import pytest

import compiled_autograd as ca

ROOT = Path(__file__).resolve().parent.parent


def _array_attribute_assignments():
    found = []
    for package in ("compiled_autograd", "runtime", "codegen"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AugAssign) else [])
                for t in targets:
                    for t in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        # (an object's own attributes -- self.shape -- and a C
                        # layout's storage are not arrays)
                        if (isinstance(t, ast.Attribute) and t.attr in ("shape", "strides")
                                and not (isinstance(t.value, ast.Name)
                                         and t.value.id == "self")
                                and not (isinstance(t.value, ast.Attribute)
                                         and t.value.attr == "storage")):
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_array_shape_is_set_in_place():
    assert _array_attribute_assignments() == []


def test_a_deprecation_from_the_projects_code_fails_the_suite():
    for module in ("compiled_autograd.autograd.graph", "compiled_autograd.runtime.prims", "compiled_autograd.codegen.c"):
        with pytest.raises(DeprecationWarning):
            warnings.warn_explicit("deprecated", DeprecationWarning, "x.py", 1, module=module)
    with pytest.warns(DeprecationWarning):    # another package's: reported, not an error
        warnings.warn_explicit("deprecated", DeprecationWarning, "x.py", 1,
                               module="numpy.lib")


def test_offloaded_tensors_reload_in_their_shape(tmp_path):
    x = ca.tensor(np.arange(24.0).reshape(2, 3, 4), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with ca.autograd.graph.save_on_disk(tmp_path):
            y = (x.exp() * x).sum()
        y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.detach().numpy()) * (1 + x.detach().numpy()),
                               rtol=1e-6)
