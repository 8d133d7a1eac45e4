"""The layers of docs/architecture.md, checked on every module's imports: a module imports from its own layer or
the ones below it, never from one above (doors → pipeline → stages → formats → store → base)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "proxy.app",
        "proxy.server",
        "proxy.socket_protocol",
        "proxy.connections",
        "proxy.services",
        "proxy.cli",
        "proxy.__main__",
        "proxy.ui.routes",
    ),
    ("proxy.doors", "proxy.ui"),
    (
        "proxy.pipeline",
        "proxy.plan",
        "proxy.request_budget",
        "proxy.conversation",
        "proxy.continuations",
        "proxy.references",
        "proxy.client_compaction",
        "proxy.inspection",
        "proxy.pinning",
    ),
    (
        "proxy.history",
        "proxy.budget",
        "proxy.compaction",
        "proxy.journal",
        "proxy.upstream",
        "proxy.observability",
        "proxy.lifecycle",
    ),
    ("proxy.formats",),
    ("proxy.store",),
    (
        "proxy.types",
        "proxy.vocabulary",
        "proxy.errors",
        "proxy.config",
        "proxy.config_sections",
        "proxy.tokens",
        "proxy.offload",
        "proxy.numbers",
        "proxy.cost",
        "proxy.environment",
        "proxy.auth",
        "proxy",
    ),
)
"""Top to bottom. A name stands for the module and everything under it; the longest name that matches wins."""


def layer(module: str) -> int:
    matches = [
        (len(name), index)
        for index, names in enumerate(LAYERS)
        for name in names
        if module == name or module.startswith(name + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)")
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "proxy" or name.startswith("proxy.")}


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_a_module_imports_nothing_from_a_layer_above_its_own(path: Path) -> None:
    module = module_name(path)
    own = layer(module)
    above = sorted(name for name in imported(path) if layer(name) < own)
    assert not above, f"{module} (layer {own}) imports from a layer above it: {above}"


def test_the_layers_name_every_package() -> None:
    for path in MODULES:
        layer(module_name(path))
