"""The HTTP ports of a real `quotasched up` (the AWS Batch endpoint and the web view) under
slow, idle and hostile clients, with the limits set low through QUOTASCHED_HTTP_* and the
process held to 128 file descriptors (a systemd default is 1,024, taken by 1,100 idle
connections in the report this answers): a client trickling its headers is closed, idle
connections beyond the cap do not keep an honest request out, a second concurrent job search
is told to come back, a page on another origin cannot drive the endpoint (nothing reaches the
fact log), a foreign Host is refused, and the real AWS CLI and boto3 still work."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import QUOTASCHED, Process
from tests.integration.helpers import NO_TICKS
from tests.integration.test_aws_endpoint import aws_json

pytestmark = [pytest.mark.nats]

START_CEILING_S = 120.0
CAP = 20
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MARGIN_S = 10.0  # generous, for 2 busy cores: the server enforces the timeout, not the test
FILE_LIMIT = 128  # `up` itself holds about 15 when idle
LIMITS = {"QUOTASCHED_HTTP_MAX_CONNECTIONS": str(CAP),
          "QUOTASCHED_HTTP_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
          "QUOTASCHED_HTTP_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
          "QUOTASCHED_HTTP_KEEPALIVE_TIMEOUT_S": "5"}  # fmt: skip


class LimitedProcess(Process):
    """`Process`, with at most FILE_LIMIT open files (as systemd's LimitNOFILE would)."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.popen = subprocess.Popen(
            [QUOTASCHED, *args], env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                  (FILE_LIMIT, FILE_LIMIT)))  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(NATS URL, endpoint URL, web URL) of `quotasched up` with the low limits."""
    tmp = tmp_path_factory.mktemp("http-ports")
    env = {**os.environ, **NO_TICKS, **LIMITS}
    up = LimitedProcess(["up", "--data-dir", str(tmp / "data"), "--executor", "none",
                         "--no-projector"], env, tmp / "up.log")  # fmt: skip
    try:
        deadline = time.monotonic() + START_CEILING_S
        while not any(line.startswith("WEB=") for line in up.output().splitlines()):
            if up.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`up` printed no WEB= line:\n{up.output()}")
            time.sleep(0.1)
        found = {}
        for line in up.output().splitlines():
            if line.startswith("nats://"):
                found["nats"] = line.strip()
            elif line.startswith(("AWS_ENDPOINT_URL_BATCH=", "WEB=")):
                name, _, value = line.partition("=")
                found[name] = value.strip()
        yield found["nats"], found["AWS_ENDPOINT_URL_BATCH"], found["WEB"]
    finally:
        assert up.stop() == 0, up.output()


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def closed_by_server(sock: socket.socket, trickle: bytes, within_s: float) -> float | None:
    """Seconds until the server closed `sock` while one byte of `trickle` went out every 0.5 s
    (None: still open after `within_s`)."""
    started = time.monotonic()
    sock.settimeout(0.5)
    sent = 0
    while time.monotonic() - started < within_s:
        try:
            if sent < len(trickle):
                sock.send(trickle[sent:sent + 1])
                sent += 1
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - started
    return None


def raw(url: str, method: str, path: str, body: bytes = b"",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """(status, headers, body) of one request, its headers exactly as given (Host included)."""
    connection = http.client.HTTPConnection(*address(url), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def facts_end(nats_url: str) -> int:
    import nats

    async def ask() -> int:
        nc = await nats.connect(nats_url)
        try:
            return (await nc.jetstream().stream_info("QM_FACTS")).state.last_seq
        finally:
            await nc.close()

    return asyncio.run(ask())


@pytest.mark.parametrize("port", ["endpoint", "web"])
def test_a_client_trickling_its_headers_is_closed_within_the_header_timeout(stack, port):
    _, endpoint, web = stack
    url = endpoint if port == "endpoint" else web
    with socket.create_connection(address(url)) as sock:
        trickle = b"GET /api/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        after = closed_by_server(sock, trickle, HEADER_TIMEOUT_S + MARGIN_S)
    assert after is not None, f"the {port} still listens to a client trickling its headers"
    assert after >= HEADER_TIMEOUT_S * 0.9  # the timeout, not an error at once


def test_a_body_that_never_finishes_is_answered_408_and_closed(stack):
    _, endpoint, _ = stack
    host, port = address(endpoint)
    with socket.create_connection((host, port)) as sock:
        sock.sendall(f"POST /v1/describejobqueues HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
        sock.settimeout(BODY_TIMEOUT_S + MARGIN_S)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"RequestTimeoutException" in answer


def test_idle_connections_beyond_the_cap_do_not_keep_an_honest_request_out(stack):
    import boto3
    from botocore.config import Config

    _, endpoint, web = stack
    idle = []
    try:
        for url in (endpoint, web):  # more idle sockets than the process may open files
            for _ in range(FILE_LIMIT + 20):
                idle.append(socket.create_connection(address(url)))
        batch = boto3.client("batch", endpoint_url=endpoint, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="x",
                             config=Config(retries={"total_max_attempts": 1},
                                           connect_timeout=10, read_timeout=20))  # fmt: skip
        assert "jobQueues" in batch.describe_job_queues()  # answered
        status, _, body = raw(web, "GET", "/api/queues", headers={"Host": address(web)[0]
                                                                  + f":{address(web)[1]}"})
        assert status == 200, body
    finally:
        for sock in idle:
            sock.close()


def test_a_second_concurrent_job_search_is_told_to_come_back(stack):
    """The NATS server `up` started is paused (SIGSTOP) while the first search runs, so the
    first cannot end before the second arrives, however fast the log is to read."""
    _, _, web = stack
    host, port = address(web)
    request = (f"GET /api/job?id=no-such-job HTTP/1.1\r\nHost: {host}:{port}\r\n"
               "Connection: close\r\n\r\n").encode()  # fmt: skip
    nats_server = nats_server_of(stack)
    first, second = (socket.create_connection((host, port)) for _ in range(2))
    try:
        os.kill(nats_server, signal.SIGSTOP)
        try:
            first.sendall(request)
            time.sleep(0.5)  # the first search is waiting on the paused server
            second.sendall(request)
            refused = read_all(second)
        finally:
            os.kill(nats_server, signal.SIGCONT)
        answered = read_all(first)
    finally:
        first.close()
        second.close()
    assert refused.split(b" ", 2)[1] == b"429", refused
    assert b"Retry-After: 2" in refused
    assert answered.split(b" ", 2)[1] == b"200", answered


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def nats_server_of(stack) -> int:
    """The pid of the nats-server listening on the stack's NATS port."""
    port = address(stack[0])[1]
    found = subprocess.run(["pgrep", "-f", "nats-server"], capture_output=True, text=True)
    for pid in map(int, found.stdout.split()):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if str(port).encode() in args or any(a.endswith(b":%d" % port) for a in args):
            return pid
    pytest.fail(f"no nats-server process found for port {port}")


def test_a_page_on_another_origin_cannot_drive_the_endpoint(stack):
    """A no-cors `text/plain` POST (what a page may send without asking) and a foreign Origin
    are refused, and nothing reaches the fact log."""
    nats_url, endpoint, _ = stack
    host, port = address(endpoint)
    before = facts_end(nats_url)
    body = json.dumps({"name": "evil", "quotaSharePolicy":
                       {"idleResourceAssignmentStrategy": "FIFO"}}).encode()  # fmt: skip
    own = {"Host": f"{host}:{port}"}
    for headers in ({**own, "Content-Type": "text/plain"},
                    {**own, "Content-Type": "text/plain", "Origin": "http://evil.example"},
                    {**own, "Content-Type": "application/json", "Origin": "http://evil.example"},
                    {**own, "Content-Type": "application/json", "Origin": "null"}):
        status, answered, text = raw(endpoint, "POST", "/v1/createschedulingpolicy", body, headers)
        assert status in (400, 403), (headers, status, text)
        assert answered["x-amzn-errortype"] in ("ClientException", "AccessDeniedException")
        assert json.loads(text)["__type"] == answered["x-amzn-errortype"]
    assert facts_end(nats_url) == before
    assert aws_json(endpoint, "describe-scheduling-policies", "--arns",
                    "arn:aws:batch:local:000000000000:scheduling-policy/evil")[
        "schedulingPolicies"] == []  # fmt: skip


def test_a_foreign_host_is_refused_on_both_ports(stack):
    """DNS rebinding: a name that resolves to 127.0.0.1 but is not one the server answers to."""
    nats_url, endpoint, web = stack
    before = facts_end(nats_url)
    port = address(endpoint)[1]
    body = json.dumps({"name": "rebound", "quotaSharePolicy":
                       {"idleResourceAssignmentStrategy": "FIFO"}}).encode()  # fmt: skip
    status, headers, text = raw(endpoint, "POST", "/v1/createschedulingpolicy", body,
                                {"Host": f"rebind.example:{port}",
                                 "Content-Type": "application/json"})  # fmt: skip
    assert (status, headers["x-amzn-errortype"]) == (403, "AccessDeniedException"), text
    assert facts_end(nats_url) == before
    web_port = address(web)[1]
    assert raw(web, "GET", "/api/queues", headers={"Host": f"rebind.example:{web_port}"})[0] == 421
    assert raw(web, "GET", "/", headers={"Host": f"127.0.0.1:{web_port + 1}"})[0] == 421
    for name in ("127.0.0.1", "localhost"):  # its own names are served
        assert raw(web, "GET", "/api/queues", headers={"Host": f"{name}:{web_port}"})[0] == 200


def test_the_real_aws_cli_and_boto3_still_work(stack):
    import boto3

    _, endpoint, _ = stack
    batch = boto3.client("batch", endpoint_url=endpoint, region_name="us-east-1",
                         aws_access_key_id="x", aws_secret_access_key="x")  # fmt: skip
    arn = batch.create_scheduling_policy(
        name="sp-http", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})["arn"]
    described = aws_json(endpoint, "describe-scheduling-policies", "--arns", arn)
    assert [policy["name"] for policy in described["schedulingPolicies"]] == ["sp-http"]
    local = endpoint.replace("127.0.0.1", "localhost")  # the other name of loopback
    assert aws_json(local, "describe-scheduling-policies", "--arns", arn)["schedulingPolicies"]


def test_a_deeply_nested_json_body_is_an_aws_shaped_400(stack):
    _, endpoint, _ = stack
    host, port = address(endpoint)
    for body in (b"[" * 100_000 + b"]" * 100_000,
                 b'{"jobQueues": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        status, headers, text = raw(endpoint, "POST", "/v1/describejobqueues", body,
                                    {"Host": f"{host}:{port}",
                                     "Content-Type": "application/json"})  # fmt: skip
        assert (status, headers.get("x-amzn-errortype")) == (400, "ClientException"), text[:300]
        answer = json.loads(text)
        assert answer["__type"] == "ClientException"
        assert answer["message"].startswith("the request body is not valid JSON")
