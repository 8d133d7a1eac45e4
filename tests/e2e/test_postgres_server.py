"""The PostgreSQL the storage tests will run on: a real server, on loopback only, never as root, gone after."""

from __future__ import annotations

import os

from tests.support.postgres_server import PostgresServer


def test_a_real_postgresql_serves_loopback_as_an_unprivileged_user_and_leaves_nothing() -> None:
    with PostgresServer() as server:
        assert server.psql("SHOW listen_addresses") == "127.0.0.1"
        assert server.psql("SELECT 41 + 1") == "42"
        owner = (server.data / "postmaster.pid").stat().st_uid
        assert owner != 0
        if os.geteuid() == 0:
            assert server.psql("SELECT current_user") == "postgres"
        root = server.root
    assert not root.exists()
