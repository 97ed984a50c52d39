"""What the project installs (issue 29, item 15): one top-level import package,
``compiled_autograd``. The folders ``runtime/`` and ``codegen/`` stay where
DESIGN.md puts them and are installed as ``compiled_autograd.runtime`` and
``compiled_autograd.codegen`` (pyproject's ``package-dir``), so nothing this project
installs can shadow another package (PyPI's ``codegen`` installs a top-level
``codegen``) or be shadowed by one. docs/architecture.md, "Packaging".

The wheel is built once here (``pip wheel --no-deps``, as ``pip install .`` builds
it), installed into a directory of its own and run from outside the checkout; a
checkout (``PYTHONPATH=<root>``, as several tests' subprocesses run) is checked too.
"""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder of the checkout -> the package it is installed as
FOLDERS = {"compiled_autograd": "compiled_autograd", "runtime": "compiled_autograd/runtime",
           "codegen": "compiled_autograd/codegen"}
SHIPPED = ("*.py", "*.c", "*.j2")


def _pip(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check",
                           "--quiet"], capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    done = _pip("wheel", "--no-deps", "--wheel-dir", str(out), str(ROOT))
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("compiled_autograd-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """The wheel installed by pip into a directory of its own (its console script
    in ``bin/``), to be put first on a fresh interpreter's path."""
    target = tmp_path_factory.mktemp("site")
    done = _pip("install", "--no-deps", "--no-index", "--target", str(target), str(wheel))
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _run(code_or_args, *, path, cwd, env=None):
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(path), **(env or {})))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_wheel_installs_one_top_level_package_with_every_file(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"compiled_autograd"}
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if top_level is not None:
        assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["compiled_autograd"]
    # every module, C source and template of the three folders, under its new name
    # (a subpackage missing from pyproject's explicit list fails here)
    expected = {f"{package}/{p.relative_to(ROOT / folder).as_posix()}"
                for folder, package in FOLDERS.items() for pattern in SHIPPED
                for p in (ROOT / folder).rglob(pattern) if "__pycache__" not in p.parts}
    assert sorted(expected - set(names)) == []
    assert not any(n.startswith(("runtime/", "codegen/")) for n in names)


CHECK = """
import sys
import numpy as np
import compiled_autograd as ca
from compiled_autograd.codegen import c_run

print(ca.__file__)
print(ca.runtime.__file__)
print(c_run.__file__)
x = ca.randn(4, 3)
w = ca.randn(3, 2, requires_grad=True)
grads = {}
for backend in ("eager", "python", "c"):
    w.grad = None
    with ca.compiled_backward(backend=backend):
        (x @ w).tanh().sum().backward()
    grads[backend] = w.grad.numpy()
np.testing.assert_allclose(grads["python"], grads["eager"], rtol=1e-6)
np.testing.assert_allclose(grads["c"], grads["eager"], rtol=1e-5)
print(c_run.C_CALL.status().split(":")[0])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("runtime", "codegen")))
"""


def test_the_installed_wheel_runs_a_compiled_backward_on_every_backend(installed, tmp_path):
    out = _run(CHECK, path=installed, cwd=tmp_path).split("\n")
    package = installed / "compiled_autograd"
    assert out[:3] == [str(package / "__init__.py"), str(package / "runtime" / "__init__.py"),
                       str(package / "codegen" / "c_run.py")]
    assert out[3] in ("native", "python")     # native where a compiler and headers are
    assert out[4] == "[]"                     # nothing imported as runtime.* / codegen.*


@pytest.mark.parametrize("other_first", [True, False])
def test_another_codegen_and_runtime_shadow_nothing_and_are_not_shadowed(
        installed, tmp_path, other_first):
    """Other top-level ``codegen`` and ``runtime`` packages (PyPI has a ``codegen``)
    on the path, before or after the installed wheel: the compiled backward runs
    on the project's modules, and ``import codegen`` is the other package."""
    other = tmp_path / "other"
    for name in ("codegen", "runtime"):
        (other / name).mkdir(parents=True)
        (other / name / "__init__.py").write_text(f"WHO = 'the other {name}'\n")
    path = os.pathsep.join(map(str, [other, installed] if other_first else [installed, other]))
    # pkg_rewrite: off (the other packages, by their top-level names)
    code = CHECK + "import codegen, runtime\nprint(codegen.WHO, '|', runtime.WHO)\n"
    # pkg_rewrite: on
    out = _run(code, path=path, cwd=tmp_path).split("\n")
    assert out[1] == str(installed / "compiled_autograd" / "runtime" / "__init__.py")
    assert out[4:6] == ["[]", "the other codegen | the other runtime"]


def test_the_installed_console_script_and_module_run(installed, tmp_path):
    small = ["trace", "--example", "mlp", "--layers", "1", "--width", "8", "--batch", "4"]
    script = installed / "bin" / "compiled-autograd"
    done = subprocess.run([str(script), *small], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(installed)))
    assert done.returncode == 0, done.stderr
    assert "backward of mlp" in done.stdout and "accumulate_grad" in done.stdout
    assert _run(["-m", "compiled_autograd", *small], path=installed, cwd=tmp_path) == done.stdout


def test_a_checkout_finds_the_two_folders_under_the_package_name(tmp_path):
    """PYTHONPATH=<checkout> (the tests' subprocesses): ``compiled_autograd.runtime``
    is the checkout's ``runtime/``, and no project module is imported under a
    top-level ``runtime``/``codegen`` name."""
    out = _run(CHECK, path=ROOT, cwd=tmp_path).split("\n")
    assert out[:3] == [str(ROOT / "compiled_autograd" / "__init__.py"),
                       str(ROOT / "runtime" / "__init__.py"), str(ROOT / "codegen" / "c_run.py")]
    assert out[4] == "[]"


@pytest.mark.parametrize("module", ["compiled_autograd.runtime.prims",
                                    "compiled_autograd.runtime.cbuild",
                                    "compiled_autograd.codegen.c_run"])
def test_a_runtime_or_codegen_module_imported_first(module, tmp_path):
    """Importing a submodule runs ``compiled_autograd/__init__.py`` first (Python's
    rule): the facade then imports the runtime, with no cycle, before the
    submodule asked for is loaded."""
    out = _run(f"import {module} as m, sys; print(m.__name__, 'compiled_autograd' in sys.modules)",
               path=ROOT, cwd=tmp_path)
    assert out.split() == [module, "True"]


def test_the_checkout_finder_is_only_for_a_checkout(tmp_path):
    from compiled_autograd import _checkout
    assert _checkout.is_checkout(str(ROOT / "compiled_autograd"))
    # an installed copy: the two folders inside the package, none beside it
    installed = tmp_path / "site" / "compiled_autograd"
    for folder in ("runtime", "codegen"):
        (installed / folder).mkdir(parents=True)
        (installed / folder / "__init__.py").write_text("")
    assert not _checkout.is_checkout(str(installed))
    # an installed copy next to some other top-level runtime/ and codegen/
    for folder in ("runtime", "codegen"):
        (tmp_path / "site" / folder).mkdir()
        (tmp_path / "site" / folder / "__init__.py").write_text("")
    assert not _checkout.is_checkout(str(installed))
    assert _checkout.CheckoutFinder.find_spec("runtime") is None
    assert _checkout.CheckoutFinder.find_spec("compiled_autograd.tests") is None
