"""A check that holds .ci/schemathesis.toml's exceptions to their causes.

POST /v1/payments may answer 422 only when this run already made a request with the same key and
another body, 413 only to a body over the limit, and 402 only to a source the mock gateway
declines (`tok_chargeDeclined`) or does not know (anything not `tok_...`); each with its own
problem type.
"""

import json
import re
import threading

import schemathesis

# src/http/extract.rs MAX_BODY_BYTES
MAX_BODY_BYTES = 16 * 1024
PROBLEMS = "https://payments.example/problems/"
# Answers that mean this request claimed its key (and so bound the key to its body).
CLAIMING_STATUSES = {201, 402, 502, 503}
# The mock gateway's tokens: this one is declined, and a source that is not a token is unknown.
DECLINED_TOKEN = "tok_chargeDeclined"

_lock = threading.Lock()
# Key (as the service reads it) -> the bodies it was claimed with. Checks run in several threads.
_claimed: dict[str, list] = {}


def _key(header: str) -> str:
    """The key a header value names: RFC 8941 quoted or bare, as src/idempotency/key.rs reads it."""
    if len(header) >= 2 and header[0] == header[-1] == '"':
        return re.sub(r"\\(.)", r"\1", header[1:-1])
    return header


def _json(raw):
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None


@schemathesis.check
def tolerated_answers_have_their_cause(ctx, response, case):
    if case.method.upper() != "POST" or case.path != "/v1/payments":
        return None
    status, request = response.status_code, response.request
    body = _json(request.body)
    key = _key(request.headers.get("Idempotency-Key", ""))
    with _lock:
        earlier = _claimed.setdefault(key, [])
        reused = any(claimed != body for claimed in earlier)
        if status in CLAIMING_STATUSES:
            earlier.append(body)
    causes = {
        422: ("idempotency-key-reused", reused),
        413: ("payload-too-large", len(request.body or b"") > MAX_BODY_BYTES),
    }
    if isinstance(body, dict) and body.get("source") == DECLINED_TOKEN:
        causes[402] = ("card-declined", True)
    else:
        source = str(body.get("source")) if isinstance(body, dict) else ""
        causes[402] = ("unknown-source", not source.startswith("tok_"))
    if status not in causes:
        return None
    kind, has_cause = causes[status]
    problem = _json(response.content) or {}
    assert problem.get("type") == PROBLEMS + kind, f"{status} is not {kind}: {problem}"
    assert has_cause, f"{status} {kind} without its cause (key {key!r}, {len(request.body or b'')} bytes)"
    return None
