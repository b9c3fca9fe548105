"""The Kubernetes failure ``Status`` object, for every listener that answers with one.

It lives at the top of the package so that the store service, the agent and the HTTP guard, which
sit below the API server kit, answer in exactly the kit's shape (``kcms.apiserver.responses``
re-exports it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["status_object"]


def status_object(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A failure ``Status`` dict in the field order kube uses."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body
