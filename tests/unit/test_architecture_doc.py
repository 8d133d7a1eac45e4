"""docs/architecture.md names only what exists: every `backticked` path is a file or folder of the tree, and every
backticked identifier (`Pipeline.answer`, `summaries.held`) occurs in the code, the tests, README.md or
proxy.example.yaml. A rename that leaves the design of record behind fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\(\))?")
MAP_PATH = re.compile(r"(?<![/\w])[\w/]+\.py\b|(?<![/\w])\w+/(?:[\w/]*\w)?(?![\w/])")


def quoted() -> set[str]:
    names = set(re.findall(r"`([^`\n]+)`", DOC))
    for block in re.findall(r"```\n(.*?)```", DOC, re.S):
        names.update(MAP_PATH.findall(block))  # the request path and the map name paths without backticks
    return names


def is_path(name: str) -> bool:
    return name.endswith(".py") or ("/" in name and " " not in name and not name.startswith("/"))


def exists(path: str) -> bool:
    path = path.rstrip("/")
    if any((base / path).exists() or (base / f"{path}.py").exists() for base in (ROOT, ROOT / "proxy")):
        return True
    return "/" not in path and any((ROOT / "proxy").rglob(path))  # a module listed under its folder in the map


def corpus() -> str:
    files = [*(ROOT / "proxy").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), ROOT / "README.md"]
    return "\n".join(path.read_text() for path in [*files, ROOT / "proxy.example.yaml"])


NAMES = sorted(quoted())


def test_the_doc_names_paths_and_identifiers() -> None:
    assert sum(map(is_path, NAMES)) > 30
    assert sum(1 for name in NAMES if not is_path(name) and IDENTIFIER.fullmatch(name)) > 30


@pytest.mark.parametrize("path", [name for name in NAMES if is_path(name)])
def test_every_path_the_doc_names_exists(path: str) -> None:
    assert exists(path), f"docs/architecture.md names {path}, which is not in the tree"


def missing(names: list[str], text: str) -> list[str]:
    """The identifiers among `names` of which some dotted part is not a word of `text` (a part is all word
    characters, so it stands between word boundaries exactly when it is one of the text's runs of them: the text
    is split once, not searched once per part)."""
    words = set(re.findall(r"\w+", text))
    return [
        name
        for name in names
        if not is_path(name)
        and IDENTIFIER.fullmatch(name)
        and not all(part in words for part in name.removesuffix("()").split("."))
    ]


def test_every_identifier_the_doc_names_occurs_in_the_tree() -> None:
    gone = missing(NAMES, corpus())
    assert not gone, f"docs/architecture.md names what the tree does not hold: {gone}"


def test_a_name_that_is_gone_is_found_missing() -> None:
    assert not exists("doors/no_such_door.py")
    assert missing(["Door.parse", "Door.parse_request", "parse()", "open_stream"], "class Door: def parse") == [
        "Door.parse_request",
        "open_stream",
    ]
