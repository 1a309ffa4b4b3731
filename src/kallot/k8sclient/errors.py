"""The one error type of a Kubernetes API request (``ApiError``), for the scheduler, the node
agent and the test helpers alike.

Raised by ``k8sclient.api`` (and the clients built on it, ``kube.api.client.KubeClient`` and
``node.k8s.NodeClient``) when the API server answers with an error status, or when no answer
came. Imports nothing heavy, so callers that only catch it do not load the client library.
"""

from __future__ import annotations

import json

from kallot.core.errors import KallotError


class ApiError(KallotError):
    """A request the API server answered with an error status (or could not be sent).

    ``status`` is the HTTP status (0 when no answer came: connection refused, timeout), so
    callers can tell "certainly not done" (4xx) from "outcome unknown" (0, 5xx).
    """

    def __init__(self, method: str, path: str, status: int, message: str, reason: str = "") -> None:
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        self.reason = reason
        super().__init__(f"{method} {path}: HTTP {status} {reason}: {message}".strip())

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        """410: the resourceVersion is too old for a watch; list again."""
        return self.status == 410

    @property
    def outcome_unknown(self) -> bool:
        """No answer, or a server error: the request may or may not have taken effect."""
        return self.status == 0 or self.status >= 500


def error_from_body(method: str, path: str, status: int, raw: bytes) -> ApiError:
    """The ApiError of an error answer: the API's ``Status`` message and reason when the body
    is one, else the start of the body."""
    try:
        body = json.loads(raw)
    except ValueError:
        return ApiError(method, path, status, raw[:300].decode(errors="replace"))
    if isinstance(body, dict):
        return ApiError(
            method, path, status, str(body.get("message", "")), str(body.get("reason", ""))
        )
    return ApiError(method, path, status, raw[:300].decode(errors="replace"))
