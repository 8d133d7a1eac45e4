"""deploy/Dockerfile: the container listens on every interface, so it needs a client key or an explicit, loud
choice of an open proxy. Its config edits and its start command are run here as the image would run them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.cli.commands import EXIT_CONFIG, main
from proxy.config import load_config
from tests.test_cli import UvicornCalls, uvicorn_run

__all__ = ["uvicorn_run"]  # the fixture, shared with test_cli

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
CONFIG_IN_IMAGE = "/config/proxy.yaml"


def image_config(tmp_path: Path) -> Path:
    """proxy.example.yaml edited by the Dockerfile's own `RUN sed` step."""
    run = re.search(r"^RUN (sed -i .*?)(?<!\\)\n", DOCKERFILE, re.MULTILINE | re.DOTALL)
    assert run is not None, "the Dockerfile edits the example config with sed"
    config = tmp_path / "proxy.yaml"
    shutil.copy(ROOT / "proxy.example.yaml", config)
    subprocess.run(["sh", "-c", run.group(1).replace(CONFIG_IN_IMAGE, str(config))], check=True, timeout=10)
    return config


def start_command(tmp_path: Path, environ: dict[str, str]) -> tuple[list[str], str]:
    """The arguments the image's CMD passes to `context-proxy`, and what it writes to stderr."""
    cmd = re.search(r"^CMD (\[.*\])$", DOCKERFILE, re.MULTILINE)
    assert cmd is not None
    argv = json.loads(cmd.group(1))
    stub = tmp_path / "bin" / "context-proxy"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text('#!/bin/sh\nfor arg in "$@"; do echo "$arg"; done\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:{os.environ['PATH']}", **environ}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=10)
    return done.stdout.split(), done.stderr


def in_test(args: list[str], config: Path) -> list[str]:
    assert args[:3] == ["serve", "--config", CONFIG_IN_IMAGE], args
    return ["serve", "--config", str(config), *args[3:]]


def test_the_image_refuses_to_serve_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], uvicorn_run: UvicornCalls
) -> None:
    config = image_config(tmp_path)
    monkeypatch.delenv("CONTEXT_PROXY_KEY", raising=False)
    args, err = start_command(tmp_path, {})
    assert "--host" not in args
    assert not err

    assert main(in_test(args, config)) == EXIT_CONFIG
    assert "refusing to serve without auth.keys on 0.0.0.0" in capsys.readouterr().err
    assert uvicorn_run.calls == []
    assert load_config(config, environ={}).server.host == "0.0.0.0"


def test_the_image_serves_with_a_key_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uvicorn_run: UvicornCalls
) -> None:
    config = image_config(tmp_path)
    assert load_config(config, environ={"CONTEXT_PROXY_KEY": "k-123"}).auth.keys == ("k-123",)
    monkeypatch.setenv("CONTEXT_PROXY_KEY", "k-123")
    args, _err = start_command(tmp_path, {"CONTEXT_PROXY_KEY": "k-123"})
    assert main(in_test(args, config)) == 0
    assert [(call["host"], call["port"]) for call in uvicorn_run.calls] == [("0.0.0.0", 8787)]


def test_an_open_container_must_be_asked_for_and_says_so(tmp_path: Path) -> None:
    args, err = start_command(tmp_path, {"CONTEXT_PROXY_OPEN": "1"})
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert "WARNING" in err
    assert "OPEN proxy" in err
