"""`quotasched replay` (and every other offline verb) loads no NATS or HTTP client.

The CLI registers every verb at start; one verb module importing the NATS client at the top
(apply, for its `Decisions`) put nats-py and aiohttp on `quotasched replay`'s start: about
0.3 s of every replay, audit re-run and shell completion on this 2-core machine
(`python -X importtime`, 2026-12-04).  (`aiohttp` itself is a stand-in until first used:
services/__init__.py; `aiohttp.connector` is what loading it for real imports.)"""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_and_an_offline_replay_import_no_bus_client(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    probe = (
        "import sys\n"
        "from quotasched.services.cli.main import main\n"
        f"sys.argv = ['quotasched', 'replay', {str(empty)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(name for name in ('nats', 'aiohttp.connector', 'duckdb')\n"
        "                if name in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=120)  # fmt: skip
    assert result.stdout.strip().splitlines()[-1:] in ([""], []), result.stdout
