"""The generated nats-server configuration holds no password a client could log in with: each
role's password is only there as a bcrypt hash (nats-server checks passwords against it; the
end-to-end check is tests/reliability/test_permissions.py, a real server started with it)."""

from __future__ import annotations

import json

import bcrypt

from quotasched.services.config import auth


def test_the_server_file_holds_bcrypt_hashes_of_the_roles_passwords_only(tmp_path):
    roles = auth.roles([("q", "qs1")])
    auth.write(roles, tmp_path)
    text = (tmp_path / "nats-server.conf").read_text()
    users = json.loads(text[text.index("{"):])["authorization"]["users"]
    assert [user["user"] for user in users] == [role.name for role in roles]
    for role, user in zip(roles, users):
        assert role.password not in text
        assert user["password"].startswith("$2a$11$")
        assert bcrypt.checkpw(role.password.encode(), user["password"].encode())
        creds = auth.read_credentials(tmp_path / "creds" / f"{role.name}.env")
        assert creds[auth.PASSWORD_ENV] == role.password  # the client's side keeps it
