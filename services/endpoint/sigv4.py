"""Checking a request's AWS Signature Version 4, as AWS does, with botocore's own signer.

The clients (the AWS CLI, boto3, any SDK) sign each request with their secret access key:
`Authorization: AWS4-HMAC-SHA256 Credential=AKID/20250101/us-east-1/batch/aws4_request,
SignedHeaders=host;x-amz-date, Signature=<hex>` and `X-Amz-Date: 20250101T120000Z`.  The
endpoint computes the signature again over the same method, URL, signed headers and body, with
the request's own date and the region of its credential scope, using botocore's `SigV4Auth`
(the very code that signed it, so the canonical forms cannot drift apart), and compares the two
in constant time.  A refusal is AWS's own: its code, status and wording, so the AWS CLI prints
`An error occurred (<Code>) when calling the <Op> operation: <message>` as against AWS.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

SERVICE = "batch"
ALGORITHM = "AWS4-HMAC-SHA256"
AMZ_DATE = "%Y%m%dT%H%M%SZ"
MAX_SKEW = timedelta(minutes=15)  # AWS's: a signature is good 15 minutes either side of now
CONTENT_SHA256 = "x-amz-content-sha256"

# AWS's messages, word for word
MISSING = "Missing Authentication Token"
UNRECOGNIZED = "The security token included in the request is invalid."
MISMATCH = ("The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method. Consult the service "
            "documentation for details.")  # fmt: skip

_CREDENTIAL = re.compile(r"^(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)"
                         r"/aws4_request$")  # fmt: skip


class Unauthenticated(Exception):
    """A request refused before it is performed, in AWS's error shape."""

    def __init__(self, kind: str, message: str, status: int = 403):
        super().__init__(message)
        self.kind, self.message, self.status = kind, message, status


def _incomplete(message: str) -> Unauthenticated:
    return Unauthenticated("IncompleteSignatureException", message, 400)


def _invalid(message: str) -> Unauthenticated:
    return Unauthenticated("InvalidSignatureException", message)


@dataclass(frozen=True)
class Signed:
    """What an Authorization header claims."""

    access_key_id: str
    date: str  # the credential scope's YYYYMMDD
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def parse_authorization(value: str) -> Signed:
    """The parts of `AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _incomplete(f"Authorization header requires the {ALGORITHM} algorithm, not "
                          f"'{algorithm}'.")  # fmt: skip
    parts = {}
    for item in rest.split(","):
        name, sep, part = item.strip().partition("=")
        if sep:
            parts[name] = part
    missing = [name for name in ("Credential", "SignedHeaders", "Signature") if name not in parts]
    if missing:
        raise _incomplete(f"Authorization header requires '{missing[0]}' parameter. "
                          f"Authorization={value}")  # fmt: skip
    scope = _CREDENTIAL.match(parts["Credential"])
    if scope is None:
        raise _incomplete(f"Authorization header requires a Credential of the form "
                          f"AKID/YYYYMMDD/region/service/aws4_request. Authorization={value}")  # fmt: skip
    return Signed(scope["key"], scope["date"], scope["region"], scope["service"],
                  tuple(parts["SignedHeaders"].lower().split(";")), parts["Signature"])  # fmt: skip


def check_fresh(amz_date: str, now: datetime) -> None:
    """AWS's clock rule: a request signed more than 15 minutes before or after now is refused
    (a captured request cannot be replayed later)."""
    try:
        signed_at = datetime.strptime(amz_date, AMZ_DATE).replace(tzinfo=UTC)
    except ValueError:
        raise _incomplete(f"Date must be in ISO-8601 'basic format'. Got '{amz_date}'. See "
                          "http://en.wikipedia.org/wiki/ISO_8601") from None  # fmt: skip
    stamp = now.strftime(AMZ_DATE)
    if signed_at < now - MAX_SKEW:
        earliest = (now - MAX_SKEW).strftime(AMZ_DATE)
        raise _invalid(f"Signature expired: {amz_date} is now earlier than {earliest} "
                       f"({stamp} - 15 min.)")  # fmt: skip
    if signed_at > now + MAX_SKEW:
        latest = (now + MAX_SKEW).strftime(AMZ_DATE)
        raise _invalid(f"Signature not yet current: {amz_date} is still later than {latest} "
                       f"({stamp} + 15 min.)")  # fmt: skip


class _AsSigned(SigV4Auth):
    """botocore's signer over exactly the headers the client says it signed (botocore picks
    the headers it signs from a request's own; another SDK may sign others, such as
    user-agent, which botocore would leave out)."""

    def __init__(self, credentials: Credentials, region: str, signed_headers: tuple[str, ...]):
        super().__init__(credentials, SERVICE, region)
        self._signed = signed_headers

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        chosen = HTTPHeaders()
        for name in self._signed:
            for value in request.headers.get_all(name) or []:
                chosen[name] = value
        return chosen


def expected_signature(method: str, url: str, headers: list[tuple[str, str]], body: bytes,
                       signed: Signed, secret: str, amz_date: str) -> str:  # fmt: skip
    """The signature the holder of `secret` computes for this request (botocore's SigV4)."""
    request = AWSRequest(method=method, url=url, data=body)
    for name, value in headers:
        if name.lower() in signed.signed_headers:
            request.headers[name.lower()] = value
    request.context["timestamp"] = amz_date
    signer = _AsSigned(Credentials(signed.access_key_id, secret), signed.region,
                       signed.signed_headers)  # fmt: skip
    canonical = signer.canonical_request(request)
    return signer.signature(signer.string_to_sign(request, canonical), request)


def verify(method: str, url: str, headers: list[tuple[str, str]], body: bytes,
           secret_of: Callable[[str], str | None], now: datetime | None = None) -> str:  # fmt: skip
    """The access key id that signed this request, or `Unauthenticated` saying why not, in the
    order AWS checks: a signature at all, its form, the key, the clock, the signature itself.
    `secret_of(access key id)` is the key's secret, None for a key it does not know."""
    found = {name.lower(): value for name, value in headers}
    if "authorization" not in found:
        raise Unauthenticated("MissingAuthenticationTokenException", MISSING)
    signed = parse_authorization(found["authorization"])
    amz_date = found.get("x-amz-date")
    if amz_date is None:
        raise _incomplete("Authorization header requires existence of either a 'X-Amz-Date' or "
                          f"a 'Date' header. Authorization={found['authorization']}")  # fmt: skip
    missing = {"host", "x-amz-date"} - set(signed.signed_headers)
    if missing:
        raise _invalid(f"'{min(missing)}' must be a 'SignedHeader' in the AWS Authorization.")
    secret = secret_of(signed.access_key_id)
    if secret is None:
        raise Unauthenticated("UnrecognizedClientException", UNRECOGNIZED)
    check_fresh(amz_date, now or datetime.now(UTC))
    _check_scope(signed, amz_date)
    digest = hashlib.sha256(body).hexdigest()
    if found.get(CONTENT_SHA256, digest) != digest:  # canonical_request would trust the header
        raise _invalid("The provided 'x-amz-content-sha256' header does not match what was "
                       "computed.")  # fmt: skip
    expected = expected_signature(method, url, headers, body, signed, secret, amz_date)
    if not hmac.compare_digest(expected.encode(), signed.signature.encode()):
        raise _invalid(MISMATCH)
    return signed.access_key_id


def _check_scope(signed: Signed, amz_date: str) -> None:
    if signed.service != SERVICE:
        raise _invalid(f"Credential should be scoped to correct service: '{SERVICE}'. ")
    if signed.date != amz_date[:8]:
        raise _invalid(f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version "
                       f"of date from HTTP: '{signed.date}' != '{amz_date[:8]}', from "
                       f"'{amz_date}'.")  # fmt: skip


def signature_of(headers: list[tuple[str, str]]) -> tuple[str, datetime] | None:
    """(signature, signing time) of a request `verify` accepted, for `Replays`."""
    found = {name.lower(): value for name, value in headers}
    try:
        signed = parse_authorization(found["authorization"])
        at = datetime.strptime(found["x-amz-date"], AMZ_DATE).replace(tzinfo=UTC)
    except (KeyError, ValueError, Unauthenticated):
        return None
    return signed.signature, at


class Replays:
    """The signatures of state-changing requests accepted while they are still fresh (signed
    within MAX_SKEW of now): a second use of one is a replay, refused, so a captured request
    cannot be performed twice (AWS leaves that to `clientToken`; here a replay is refused as
    well).  Reads are not claimed: repeating one changes nothing, and a client polling twice
    within a second sends the very same signature.  `claim` before
    performing, `release` when the request failed (the client may retry it unchanged: botocore
    re-signs a retry within the same second to the same signature).  Memory is bounded: at most
    `capacity` signatures, each forgotten once it has expired; when full of fresh ones, a new
    signature is refused until some expire."""

    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self._expiry: dict[str, datetime] = {}  # in claim order; expiries nearly in order too

    def claim(self, signature: str, signed_at: datetime, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        self._forget_expired(now)
        if signature in self._expiry:
            raise _invalid("This request was already received: a signed request is performed "
                           "once (sign it again to repeat it).")  # fmt: skip
        if len(self._expiry) >= self.capacity:
            raise Unauthenticated("ThrottlingException", "Too many signed requests in the last "
                                  "15 minutes; try again later.", 429)  # fmt: skip
        self._expiry[signature] = signed_at + MAX_SKEW

    def release(self, signature: str) -> None:
        self._expiry.pop(signature, None)

    def _forget_expired(self, now: datetime) -> None:
        # the oldest claims first; stop at the first fresh one (a request signed up to 15
        # minutes ahead may sit before older ones: it is forgotten a little late, never early)
        expired = []
        for signature, expiry in self._expiry.items():
            if expiry > now or len(expired) >= 1000:
                break
            expired.append(signature)
        for signature in expired:
            del self._expiry[signature]

    def __len__(self) -> int:
        return len(self._expiry)
