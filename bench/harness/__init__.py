"""What every benchmark in bench/ shares; a benchmark script is its measurement and its command line, no more.

    processes   child processes on 127.0.0.1 (started until healthy, stopped with their children); memory
    servers     the fake upstream, the floor (a bare pass-through) and the proxy as child processes; configs
    clients     benchmark histories, timed calls, streamed reads, load runs, the alternating round order
    agents      driving a real agent CLI (Codex, Claude Code) through the proxy served in-process, recorded
    report      the one result format: a `Report` of tables, written with `--json PATH` and printed as text

In-process servers come from tests/support (`ProxyServer`, `FakeUpstream`): benchmarks and end-to-end tests
serve the proxy the same way.
"""
