"""The private event loop the sync client (`TrainingQueue`, `TrainingQueuedJob`) runs the
async client's coroutines on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


class _Loop:
    """A private event loop on a daemon thread, so the sync API works anywhere."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()
