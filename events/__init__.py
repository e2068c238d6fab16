"""The public contract of quotasched: commands in, facts out (see contract.md in the README)."""

from events.codec import DecodeError, decode_command, decode_fact, encode
from events.commands import *  # noqa: F403
from events.facts import *  # noqa: F403
from events.values import *  # noqa: F403
