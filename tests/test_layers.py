"""The library's layers cannot erode: each module imports only from the layers below its own
(the import-linter contract in pyproject.toml), the picture in docs/decisions.md lists
the same layers in the same order, and an import inside a function says why it is there
(a heavy or optional dependency loaded only when needed)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def contract_layers() -> list[list[str]]:
    """The contract's layers, top first, each a list of module names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = config["tool"]["importlinter"]["contracts"]
    return [[name.strip() for name in re.split(r"[:|]", layer)] for layer in contract["layers"]]


def test_no_module_imports_from_a_layer_above_its_own():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_every_module_of_the_library_is_in_a_layer():
    """A new module must be placed in the picture, not fall between the layers."""
    placed = {name for layer in contract_layers() for name in layer}
    package = ROOT / "minillm"
    tops = {f"minillm.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    tops |= {f"minillm.{p.name}" for p in package.iterdir()
             if (p / "__init__.py").exists()}
    tops.discard("minillm.kernels")  # kernels/ beside minillm/ (a link to it in some checkouts)
    assert tops - placed == set()
    assert placed - tops == set()


def test_the_decisions_picture_lists_the_contracts_layers_in_order():
    text = (ROOT / "docs" / "decisions.md").read_text()
    picture = text[text.index("<!-- layers -->"):text.index("<!-- /layers -->")]
    rows = [line for line in picture.splitlines() if line.startswith("|") and "minillm" in line]
    assert len(rows) == len(contract_layers())
    for row, layer in zip(rows, contract_layers(), strict=True):
        assert set(re.findall(r"minillm(?:\.\w+)+", row)) == set(layer), row


def test_an_import_inside_a_function_says_why():
    """Imports go at the top of a module; the few inside functions load a heavy or optional
    dependency (transformers, Triton, xgrammar, uvicorn, ...) only when it is needed, and
    carry a comment saying so (on the import's line or the line above)."""
    silent = []
    for path in (ROOT / "minillm").rglob("*.py"):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom) and \
                            "#" not in lines[inner.lineno - 1] + lines[inner.lineno - 2]:
                        silent.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    assert silent == []
