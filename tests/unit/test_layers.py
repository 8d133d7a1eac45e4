"""The layers of docs/architecture.md, checked on every module's imports: a module imports from its own layer or
the ones below it, never from one above (serving → doors → request → stages → formats → canonical → store → kernel)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"

KERNEL = (
    "proxy",
    "proxy.errors",
    "proxy.config",
    "proxy.tokens",
    "proxy.offload",
    "proxy.numbers",
    "proxy.cost",
    "proxy.environment",
    "proxy.auth",
)
"""The shared kernel: the few modules every layer may use. It stays small: a concept with more than a module or
two gets a package of its own in the layer it belongs to."""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("proxy.serving", "proxy.cli", "proxy.__main__", "proxy.ui.routes"),
    ("proxy.doors", "proxy.ui"),
    ("proxy.request", "proxy.inspection"),
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
    ("proxy.canonical",),
    ("proxy.store",),
    KERNEL,
)
"""Top to bottom. A name stands for the package or module and everything under it; the longest name that matches
wins. The root package `proxy` holds no code of its own, so it names only itself: a module left loose at the top
of `proxy/` is in no layer until it is added to the kernel (and to docs/architecture.md)."""


def layer(module: str) -> int:
    matches = [
        (len(name), index)
        for index, names in enumerate(LAYERS)
        for name in names
        if module == name or (name != "proxy" and module.startswith(name + "."))
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


def test_a_module_left_loose_at_the_top_is_in_no_layer() -> None:
    with pytest.raises(AssertionError, match=r"proxy\.loose is in no layer"):
        layer("proxy.loose")
    assert layer("proxy") == len(LAYERS) - 1


def test_the_kernel_stays_small() -> None:
    loose = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert len(loose) <= 11, f"{len(loose)} modules lie loose at the top of proxy/: {loose}"
