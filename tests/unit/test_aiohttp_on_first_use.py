"""aiohttp is loaded on its first use, not when nats-py is imported (services/__init__.py):
a scheduler process starts without it, and whatever uses it gets the real module.  Each
case runs in a fresh interpreter, as a process starts."""

from __future__ import annotations

import subprocess
import sys


def probe(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)  # fmt: skip
    return result.stdout.split()


def test_a_scheduler_process_imports_nats_without_loading_aiohttp():
    assert probe(
        "import sys\n"
        "import quotasched.services.runtime, quotasched.services.scheduler.service\n"
        "import nats, nats.aio.transport\n"
        "print('nats' in sys.modules, 'aiohttp.connector' in sys.modules)\n"
    ) == ["True", "False"]


def test_the_first_use_loads_the_real_aiohttp_for_everyone():
    """`from aiohttp import web` (the web view, the endpoint), then what nats-py holds (the
    stand-in it imported) hands over the real module's attributes."""
    assert probe(
        "import sys\n"
        "import quotasched.services\n"
        "import nats.aio.transport as transport\n"
        "stand_in = transport.aiohttp\n"
        "from aiohttp import web\n"
        "import aiohttp\n"
        "real = sys.modules['aiohttp']\n"
        "print(type(stand_in).__name__, type(real).__name__, aiohttp is real,\n"
        "      stand_in.ClientSession is real.ClientSession, web.Application.__module__,\n"
        "      'aiohttp.connector' in sys.modules)\n"
    ) == ["_OnFirstUse", "module", "True", "True", "aiohttp.web_app", "True"]


def test_an_attribute_first_loads_it_too():
    assert probe(
        "import sys\n"
        "import quotasched.services\n"
        "import aiohttp\n"
        "print(aiohttp.WSMsgType.BINARY.name, type(sys.modules['aiohttp']).__name__)\n"
    ) == ["BINARY", "module"]


def test_an_aiohttp_already_imported_is_left_alone():
    assert probe(
        "import sys, aiohttp\n"
        "import quotasched.services\n"
        "print(sys.modules['aiohttp'] is aiohttp, type(aiohttp).__name__)\n"
    ) == ["True", "module"]
