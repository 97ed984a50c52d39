"""Loading generated code (DESIGN.md: the runtime loads generated Python and C).

``load_python`` compiles a source under a unique filename, registers it with
``linecache`` so tracebacks show the generated lines, and runs it in a fresh
namespace built from ``namespace``.
"""
from __future__ import annotations

import hashlib
import linecache


def source_filename(source: str, kind: str = "backward") -> str:
    """A stable, content-addressed pseudo-filename for generated source."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    return f"<compiled_autograd {kind} {digest}>"


def load_python(source: str, namespace: dict, kind: str = "backward"):
    """Compile and execute ``source``; returns (filename, the resulting namespace)."""
    filename = source_filename(source, kind)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"__builtins__": __builtins__, **namespace}
    exec(compile(source, filename, "exec"), scope)
    return filename, scope
