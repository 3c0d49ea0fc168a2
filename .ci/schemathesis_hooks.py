"""A check that holds .ci/schemathesis.toml's exceptions to their causes.

POST /v1/payments, POST /v1/refunds and POST /v1/payments/{id}/capture and /cancel may answer 422
only when this run already claimed the key with another body or on another endpoint or payment (a
key serves one request), and 413 only to a body over the limit. POST /v1/payments may answer 402 only to a source the mock gateway declines
(`tok_chargeDeclined`) or does not know (anything not `tok_...`). POST /v1/refunds may answer a
schema-valid request 400 only with a refusal decided against a payment that this run made (the
links of openapi.yaml hand its id from one answer to the next request): `payment-not-refundable`,
`payment-already-refunded`, or `refund-exceeds-payment` for more than the `refundable` it names.
Each with its own problem type. A capture or a cancel may answer a schema-valid request 400 only
against a payment this run made: `payment-not-capturable` or `payment-not-cancelable`, or
`capture-exceeds-authorization` for more than the `capturable` it names. POST /webhooks/gateway may answer 400 only `invalid-signature`: the
fuzzer does not hold the gateway's secret, so no event it sends is signed. A webhook endpoint's create
or update may answer a schema-valid body 400 only for its URL (`invalid-webhook-url`,
`webhook-url-not-allowed`) or `*` beside other types (`invalid-request`); a rotation's 404 is stored
under its key; a recovery's 400 only for an `until` before `since`.
"""

import json
import re
import threading
from urllib.parse import urlparse

import schemathesis

# src/http/extract.rs MAX_BODY_BYTES
MAX_BODY_BYTES = 16 * 1024
PROBLEMS = "https://payments.example/problems/"
# The endpoints whose requests claim keys.
CHANGES = {"/v1/payments/{id}/capture", "/v1/payments/{id}/cancel"}
ENDPOINTS = "/v1/webhook_endpoints"
ROTATE = "/v1/webhook_endpoints/{id}/rotate_secret"
KEYED = {"/v1/payments", "/v1/refunds", ENDPOINTS, ROTATE} | CHANGES
# A webhook endpoint's refusals of a schema-valid body: what the schema cannot judge.
URL_REFUSALS = {"invalid-webhook-url", "webhook-url-not-allowed"}
# Answers that mean this request claimed its key (and so bound the key to its endpoint and body).
CLAIMING_STATUSES = {200, 201, 402, 502, 503}
# A refund's, a capture's and a cancel's refusals, decided against the payment once the request
# claimed its key, and stored.
REFUSALS = {"payment-not-found", "payment-not-refundable", "payment-already-refunded", "refund-exceeds-payment"}
CHANGE_REFUSALS = {"payment-not-found", "payment-not-capturable", "payment-not-cancelable",
                   "capture-exceeds-authorization"}
# The mock gateway's tokens: this one is declined, and a source that is not a token is unknown.
DECLINED_TOKEN = "tok_chargeDeclined"

_lock = threading.Lock()
# Key (as the service reads it) -> the (endpoint, body) it was claimed with. Checks run in several threads.
_claimed: dict[str, list] = {}
# The ids of the payments this run saw in answers: those it can have learnt, and refunded.
_payments: set[str] = set()


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


def _payments_in(document) -> set[str]:
    """The ids of the payments anywhere in an answer (a payment, a list, a problem embedding one)."""
    found, pending = set(), [document]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if item.get("object") == "payment" and isinstance(item.get("id"), str):
                found.add(item["id"])
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def _is_positive(case) -> bool:
    meta = getattr(case, "meta", None)
    return meta is not None and meta.generation.mode.is_positive


@schemathesis.check
def tolerated_answers_have_their_cause(ctx, response, case):
    answer = _json(response.content)
    with _lock:
        _payments.update(_payments_in(answer))
    if case.method.upper() == "POST" and case.path == "/webhooks/gateway" and response.status_code == 400:
        kind = str((answer if isinstance(answer, dict) else {}).get("type", "")).removeprefix(PROBLEMS)
        assert kind == "invalid-signature", f"an unsigned event refused as {kind}: {answer}"
        return None
    if (case.method.upper() == "POST" and case.path == ENDPOINTS + "/{id}" and response.status_code == 400
            and _is_positive(case)):
        _check_endpoint_refusal(answer, _json(response.request.body))
        return None
    if case.method.upper() == "POST" and case.path == ENDPOINTS + "/{id}/recover" and response.status_code == 400:
        body = _json(response.request.body)
        kind = str((answer if isinstance(answer, dict) else {}).get("type", "")).removeprefix(PROBLEMS)
        if _is_positive(case):
            since, until = (body.get("since"), body.get("until")) if isinstance(body, dict) else (None, None)
            numbers = all(isinstance(n, (int, float)) for n in (since, until))
            assert kind == "invalid-request" and numbers and until < since, \
                f"a recovery refused as {kind}: {answer}"
        return None
    if case.method.upper() != "POST" or case.path not in KEYED:
        return None
    status, request, path = response.status_code, response.request, case.path
    body = _json(request.body)
    problem = answer if isinstance(answer, dict) else {}
    kind = str(problem.get("type", "")).removeprefix(PROBLEMS)
    key = _key(request.headers.get("Idempotency-Key", ""))
    # The request as its key holds it: the path as sent (a capture's names its payment), and the body.
    sent = urlparse(request.url).path
    refused = ((path == "/v1/refunds" and kind in REFUSALS) or (path in CHANGES and kind in CHANGE_REFUSALS)
               or (path == ROTATE and kind == "webhook-endpoint-not-found"))
    with _lock:
        earlier = _claimed.setdefault(key, [])
        reused = any(claimed != (sent, body) for claimed in earlier)
        if status in CLAIMING_STATUSES or refused:
            earlier.append((sent, body))
        about = sent.split("/")[3] if path in CHANGES else (body.get("payment") if isinstance(body, dict) else None)
        known_payment = str(about) in _payments
    causes = {
        422: ("idempotency-key-reused", reused),
        413: ("payload-too-large", len(request.body or b"") > MAX_BODY_BYTES),
    }
    if path == "/v1/payments":
        if isinstance(body, dict) and body.get("source") == DECLINED_TOKEN:
            causes[402] = ("card-declined", True)
        else:
            source = str(body.get("source")) if isinstance(body, dict) else ""
            causes[402] = ("unknown-source", not source.startswith("tok_"))
    elif path in CHANGES and _is_positive(case) and status == 400:
        # A schema-valid capture or cancel refused: only against a payment this run made.
        if kind == "capture-exceeds-authorization":
            capturable = problem.get("capturable")
            asked = body.get("amount") if isinstance(body, dict) else None
            exceeds = isinstance(capturable, int) and isinstance(asked, (int, float)) and asked > capturable
            causes[400] = (kind, known_payment and exceeds)
        elif kind in ("payment-not-capturable", "payment-not-cancelable"):
            causes[400] = (kind, known_payment)
        else:
            causes[400] = ("a refusal", False)
    elif path == ENDPOINTS and _is_positive(case) and status == 400:
        _check_endpoint_refusal(answer, body)
        return None
    elif _is_positive(case) and status == 400:
        # A schema-valid refund refused: only against a payment this run made, for what it was then.
        if kind == "refund-exceeds-payment":
            refundable = problem.get("refundable")
            asked = body.get("amount") if isinstance(body, dict) else None
            exceeds = isinstance(refundable, int) and isinstance(asked, (int, float)) and asked > refundable
            causes[400] = (kind, known_payment and exceeds)
        elif kind in ("payment-not-refundable", "payment-already-refunded"):
            causes[400] = (kind, known_payment)
        else:
            causes[400] = ("a refusal", False)
    if status not in causes:
        return None
    expected, has_cause = causes[status]
    if expected != "a refusal":
        assert kind == expected, f"{status} is not {expected}: {problem}"
    assert has_cause, f"{status} {expected} without its cause (key {key!r}, {len(request.body or b'')} bytes): {problem}"
    return None


def _check_endpoint_refusal(answer, body):
    """A schema-valid webhook endpoint (or update) refused 400: only for what the schema cannot
    judge: its URL (one the parser refuses, or at an address the service never sends to), or `*`
    beside other event types."""
    kind = str((answer if isinstance(answer, dict) else {}).get("type", "")).removeprefix(PROBLEMS)
    events = body.get("enabled_events") if isinstance(body, dict) else None
    every_beside_others = isinstance(events, list) and "*" in events and any(e != "*" for e in events)
    sent_url = isinstance(body, dict) and "url" in body
    assert (kind in URL_REFUSALS and sent_url) or (kind == "invalid-request" and every_beside_others), \
        f"a webhook endpoint refused as {kind}: {answer}"
