"""The names of vLLM 0.25.0's `EngineArgs` fields, read without importing vLLM, for config
validation (`omni_mp.config.validate`): importing `vllm.engine.arg_utils` takes the launcher
10 s of a CPU core (30 s on a busy 2-core host), all before its first stage starts, and for
its field names only (each stage imports vLLM again to build its engine).

`EngineArgs` is a plain dataclass whose fields are its annotated class attributes; they are
read from its source with `ast` (0.2 s). tests/test_config.py checks them against
`dataclasses.fields(EngineArgs)`. Where the source cannot be read, vLLM is imported."""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path


def _declared_fields(source: str) -> frozenset[str] | None:
    """The field names `class EngineArgs` declares in `source`; None if it is not a class
    without bases there (then its fields may come from elsewhere)."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs"), None)
    if cls is None or cls.bases:
        return None
    names = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            kind = ast.unparse(stmt.annotation)
            if not kind.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")):
                names.add(stmt.target.id)
    return frozenset(names)


def engine_arg_names() -> frozenset[str]:
    """Every field name of `vllm.engine.arg_utils.EngineArgs`."""
    # the first vllm package on the path, as `import vllm` would find it, without running it
    for root in sys.path:
        try:
            names = _declared_fields((Path(root or ".") / "vllm" / "engine" / "arg_utils.py").read_text())
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        if names:
            return names
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))
