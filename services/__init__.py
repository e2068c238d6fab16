"""The service shell: scheduler, projector, executors, CLI, client (see docs/architecture.md).

nats-py imports aiohttp as it is imported, for its WebSocket transport, and aiohttp builds its
default TLS contexts then (loading the system's CA certificates): about 100 ms of the 450 ms a
scheduler process took to start, paid by every process and CLI command that talks to NATS
(`python -X importtime`, 2026-12-05, this 2-core machine).  So `aiohttp` is first a stand-in
module that imports the real one on its first attribute (`import aiohttp.web`, `from aiohttp
import web`, or a `ws://` NATS URL asking nats-py for `aiohttp.ClientSession`) and from then
on hands over every attribute of it.  The standard library's `LazyLoader` cannot do this: the
import system reads a module's `__spec__` on every later `import aiohttp`, which loads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class _OnFirstUse(types.ModuleType):
    """`aiohttp` until something reads an attribute of it."""

    __spec__ = None  # what `import aiohttp` reads of a module already imported: nothing to load

    def __getattr__(self, name: str):
        if sys.modules.get("aiohttp") is self:
            del sys.modules["aiohttp"]
            try:
                importlib.import_module("aiohttp")
            except BaseException:
                sys.modules.setdefault("aiohttp", self)
                raise
        return getattr(sys.modules["aiohttp"], name)


if "aiohttp" not in sys.modules and importlib.util.find_spec("aiohttp") is not None:
    sys.modules["aiohttp"] = _OnFirstUse("aiohttp")
