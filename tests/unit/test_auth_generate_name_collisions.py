"""`quotasched auth generate` refuses two (job queue, quota share) pairs that give one role name
(issue 28, point 6): `ml`/`vision-a` and `ml-vision`/`a` would both be user
pipeline-ml-vision-a, with one credentials file, inbox and consumer slots, and nats-server
refuses a configuration with a user twice."""

from __future__ import annotations

import json
import subprocess

import pytest

from quotasched.services.config import auth
from tests.integration.conftest import QUOTASCHED


def shares_file(tmp_path, pairs):
    path = tmp_path / "shares.jsonl"
    path.write_text("".join(json.dumps({"kind": "CreateQuotaShare", "jobQueue": queue,
                                        "quotaShareName": share}) + "\n"
                            for queue, share in pairs))  # fmt: skip
    return path


def test_generate_refuses_two_shares_that_become_one_user_naming_both_and_writes_nothing(tmp_path):
    config = shares_file(tmp_path, [("ml", "vision-a"), ("ml-vision", "a"), ("ml", "b")])
    out = tmp_path / "out"
    done = subprocess.run([QUOTASCHED, "auth", "generate", "--config", str(config),
                           "--out", str(out)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for name in ("'ml' share 'vision-a'", "'ml-vision' share 'a'", "pipeline-ml-vision-a"):
        assert name in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert not out.exists(), list(out.rglob("*"))


def test_distinct_pairs_give_distinct_users_credentials_inboxes_and_consumer_slots():
    pairs = [("ml", "vision-b"), ("ml-vision", "a"), ("ml", "vision"), ("ml-vision-a", "0")]
    roles = auth.roles(pairs)
    names = [role.name for role in roles]
    assert len(set(names)) == len(names)
    assert len({role.inbox for role in roles}) == len(roles)
    slots = [slot for role in roles for slot in auth.team_consumers(role.name)]
    assert len(set(slots)) == len(slots)
    assert len({role.access_key_id for role in roles}) == len(roles)


@pytest.mark.parametrize("pairs", [[("a", "b-c"), ("a-b", "c")], [("x-y-z", "w"), ("x", "y-z-w")]])
def test_every_colliding_pair_is_refused(pairs):
    with pytest.raises(auth.NameCollision, match="both become user"):
        auth.roles(pairs)
