"""Server side of the control protocol, shared by its two servers (the shadow node and the
controller service): read a request header and check its job token. Standard library only.

A request is one JSON object with the job's ``token``; a refused request is answered
``{"ok": false, "code": "bad_request" | "bad_token", "error": ...}`` (docs/shadow.md).
"""

from __future__ import annotations

import hmac
import json
from typing import Any

__all__ = ["check_request", "error_reply"]


def error_reply(code: str, error: str) -> dict[str, Any]:
    """The reply header of a refused or failed request."""
    return {"ok": False, "code": code, "error": error}


def check_request(head: bytes, token: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(request, None)`` when the request header ``head`` may be served; else ``(request,
    error reply)``: ``bad_request`` when it is not a JSON object (the request is then ``{}``),
    ``bad_token`` when its token is not the job's ``token`` (compared in constant time)."""
    try:
        req = json.loads(head)
        if not isinstance(req, dict):
            raise ValueError("request is not an object")
    except ValueError as e:
        return {}, error_reply("bad_request", f"not JSON: {e}")
    tok = req.get("token")
    if not isinstance(tok, str) or not hmac.compare_digest(tok.encode(), token.encode()):
        return req, error_reply("bad_token", "wrong or missing job token")
    return req, None
