"""The public contract of quotasched: commands in, facts out (see contract.md in the README)."""

from quotasched.events.codec import DecodeError, decode_command, decode_fact, encode
from quotasched.events.commands import *  # noqa: F403
from quotasched.events.facts import *  # noqa: F403
from quotasched.events.values import *  # noqa: F403
