"""deploy/: the image and the compose file that runs two replicas of it on PostgreSQL behind nginx.

The Dockerfile's container listens on every interface, so it needs a client key or an explicit, loud choice of an
open proxy; its config edits and its start command are run here as the image would run them. No docker daemon
here: compose.yaml, the replicas' proxy.yaml and nginx.conf are read as files and checked for what matters (two
replicas of this image, a healthy database before them, one published port, SSE relayed unbuffered, no secret
written anywhere but the environment).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from proxy.cli.commands import EXIT_CONFIG, main
from proxy.config.schema import DEFAULT_MAX_BODY_BYTES, DEFAULT_STREAM_DEADLINE_S, load_config
from tests.e2e.test_cli import UvicornCalls, uvicorn_run

__all__ = ["uvicorn_run"]  # the fixture, shared with test_cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
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


# deploy/compose.yaml: two replicas on PostgreSQL behind nginx.

COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ENV_REF = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")
"""A compose (or proxy config) `${VAR}`, `${VAR:-default}` or `${VAR:?error}`; group 1 is the variable."""
SECRET_NAME = re.compile(r"PASSWORD|KEY|SECRET|TOKEN", re.IGNORECASE)
SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret",
    "CONTEXT_PROXY_KEY": "client-key",
    "OPENAI_API_KEY": "sk-openai",
    "ANTHROPIC_API_KEY": "sk-ant",
}


def replicas() -> dict[str, dict[str, Any]]:
    return {name: service for name, service in SERVICES.items() if "build" in service}


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment as a mapping, so that it can be read here"
    return {name: str(value) for name, value in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, tuple[Path, str]]:
    """Bind mounts in the short syntax, by target: (the source on the host, the options)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *options = volume.split(":")
        if source.startswith("."):
            found[target] = ((DEPLOY / source).resolve(), ",".join(options))
    return found


def only_references(value: str | None) -> bool:
    """Nothing but `${...}` references: the value comes from the environment of `docker compose`."""
    return value is None or (bool(ENV_REF.search(value)) and ENV_REF.sub("", value) == "")


def is_official(image: str, name: str) -> bool:
    """An image of Docker Hub's official library: no registry, no namespace."""
    return image.split(":")[0] in (name, f"library/{name}", f"docker.io/library/{name}")


def test_compose_runs_two_replicas_of_this_image() -> None:
    built = replicas()
    assert sorted(built) == ["proxy-1", "proxy-2"]
    assert built["proxy-1"] == built["proxy-2"], "one definition (the x-proxy anchor), two containers"
    build = built["proxy-1"]["build"]
    assert (DEPLOY / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert "args" not in build, "nothing from the environment is built into the image"


def test_the_replicas_start_once_postgres_is_healthy() -> None:
    postgres = SERVICES["postgres"]
    assert is_official(postgres["image"], "postgres"), postgres["image"]
    assert re.fullmatch(r"postgres:\d+", postgres["image"]), "a major version, not latest"
    assert "pg_isready" in postgres["healthcheck"]["test"]
    data = [volume.split(":") for volume in postgres["volumes"]]
    assert [(name, path) for name, path, *_ in data] == [("postgres-data", "/var/lib/postgresql/data")]
    assert "postgres-data" in COMPOSE["volumes"], "a named volume: the database outlives its container"
    for service in replicas().values():
        assert service["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_only_the_load_balancer_is_published() -> None:
    published = {name for name, service in SERVICES.items() if service.get("ports")}
    assert published == {"nginx"}
    nginx = SERVICES["nginx"]
    assert is_official(nginx["image"], "nginx"), nginx["image"]
    assert set(nginx["depends_on"]) == set(replicas())
    [port] = nginx["ports"]
    assert port.split(":")[-1] == "8787"


def test_the_replicas_read_the_config_of_deploy() -> None:
    for service in replicas().values():
        source, options = mounts(service)[CONFIG_IN_IMAGE]
        assert source == DEPLOY / "proxy.yaml"
        assert options == "ro"


def test_no_secret_is_written_in_compose_or_baked_into_the_image() -> None:
    for name, service in SERVICES.items():
        for variable, value in environment(service).items():
            if SECRET_NAME.search(variable):
                reference = ENV_REF.fullmatch(value)
                assert reference, f"{name}: {variable} is written in compose.yaml, not taken from the environment"
                assert reference.group(1) == variable
    required = {"POSTGRES_PASSWORD", "CONTEXT_PROXY_KEY"}
    for service in replicas().values():
        env = environment(service)
        assert SECRETS.keys() <= env.keys()
        for variable in required:
            assert f"${{{variable}:?" in env[variable], f"{variable} must be set: compose refuses to start without"
    assert "${POSTGRES_PASSWORD:?" in environment(SERVICES["postgres"])["POSTGRES_PASSWORD"]
    baked = [line for line in DOCKERFILE.splitlines() if re.match(r"(ENV|ARG)\b", line) and SECRET_NAME.search(line)]
    assert baked == []


def test_no_secret_is_written_in_the_replicas_config() -> None:
    raw = yaml.safe_load((DEPLOY / "proxy.yaml").read_text())
    assert all(only_references(key) for key in raw["auth"]["keys"])
    assert all(only_references(model["api_key"]) for model in raw["models"] if "api_key" in model)
    assert only_references(urlsplit(raw["store"]["url"]).password)
    assert "path" not in raw["store"], "store.url and store.path exclude each other"


def test_the_replicas_config_points_at_the_postgres_service() -> None:
    """Loaded as a replica loads it, with the environment compose gives it."""
    config = load_config(DEPLOY / "proxy.yaml", environ=SECRETS)
    assert config.store.url is not None
    url = urlsplit(config.store.url)
    postgres = environment(SERVICES["postgres"])
    assert url.scheme == "postgresql"
    assert (url.hostname, url.port) == ("postgres", 5432)
    assert (url.username, url.password) == (postgres["POSTGRES_USER"], SECRETS["POSTGRES_PASSWORD"])
    assert url.path == f"/{postgres['POSTGRES_DB']}"
    assert config.server.host == "0.0.0.0"
    assert config.server.port == 8787
    assert config.auth.keys == (SECRETS["CONTEXT_PROXY_KEY"],)
    assert {model.api_key for model in config.models} == {SECRETS["OPENAI_API_KEY"], SECRETS["ANTHROPIC_API_KEY"]}


# deploy/nginx.conf, read with a parser just strict enough to catch unbalanced braces and misplaced directives.


@dataclass
class Directive:
    name: str
    args: tuple[str, ...]
    block: list[Directive] | None = None

    def all(self, name: str) -> list[Directive]:
        return [child for child in self.block or [] if child.name == name]

    def one(self, name: str) -> Directive:
        [found] = self.all(name)
        return found


NGINX_TOKEN = re.compile(r"#[^\n]*|\"[^\"]*\"|'[^']*'|[{};]|[^\s{};#\"']+")


def parse_nginx(text: str) -> Directive:
    tokens = (token for token in NGINX_TOKEN.findall(text) if not token.startswith("#"))
    return Directive("", (), _nginx_block(tokens, inside=False))


def _nginx_block(tokens: Iterator[str], *, inside: bool) -> list[Directive]:
    directives: list[Directive] = []
    words: list[str] = []
    for token in tokens:
        if token in (";", "{"):
            assert words, f"{token!r} without a directive"
            block = _nginx_block(tokens, inside=True) if token == "{" else None
            directives.append(Directive(words[0], tuple(words[1:]), block))
            words = []
        elif token == "}":
            assert inside, "a '}' closes no block"
            assert not words, f"{words} without ';'"
            return directives
        else:
            words.append(token)
    assert not inside, "a block is never closed"
    assert not words, f"{words} without ';'"
    return directives


def nginx_config() -> Directive:
    """deploy/nginx.conf, parsed in each test: a broken file fails the nginx tests, not the module's collection."""
    return parse_nginx((DEPLOY / "nginx.conf").read_text())


def seconds(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(s|m|h)?", value).groups()  # type: ignore[union-attr]
    return int(number) * {None: 1, "s": 1, "m": 60, "h": 3600}[unit]


def test_the_nginx_parser_refuses_unbalanced_braces() -> None:
    assert parse_nginx("a { b 1; c { d; } }").one("a").one("c").one("d").args == ()
    for broken in ("a { b;", "a { b; } }", "a { b }", "a"):
        with pytest.raises(AssertionError):
            parse_nginx(broken)


def test_nginx_balances_round_robin_over_both_replicas() -> None:
    mounted = {target for target, (source, _) in mounts(SERVICES["nginx"]).items() if source == DEPLOY / "nginx.conf"}
    assert mounted == {"/etc/nginx/conf.d/default.conf"}, "included inside the image's http block"
    nginx = nginx_config()
    [upstream] = nginx.all("upstream")
    servers = [directive.args[0] for directive in upstream.all("server")]
    assert sorted(servers) == [f"{name}:8787" for name in sorted(replicas())]
    assert not {"hash", "ip_hash", "least_conn", "random"} & {directive.name for directive in upstream.block or []}
    [server] = nginx.all("server")
    assert server.one("listen").args == (SERVICES["nginx"]["ports"][0].split(":")[-1],)
    assert server.one("location").one("proxy_pass").args == (f"http://{upstream.args[0]}",)


def test_nginx_relays_streams_unbuffered() -> None:
    server = nginx_config().one("server")
    location = server.one("location")
    assert location.one("proxy_buffering").args == ("off",)
    assert location.one("proxy_request_buffering").args == ("off",)
    assert location.one("proxy_http_version").args == ("1.1",)
    assert seconds(location.one("proxy_read_timeout").args[0]) > DEFAULT_STREAM_DEADLINE_S
    body = server.one("client_max_body_size").args[0]
    assert body.endswith("m")
    assert int(body[:-1]) * 1024 * 1024 >= DEFAULT_MAX_BODY_BYTES
