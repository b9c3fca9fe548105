"""How the collector reaches node agents, an :class:`AgentAccess`: HTTPS, the agent's certificate
verified against ``ca_file`` for the name ``server_name`` (default ``kcms-agent.kube-system.svc``: one certificate
for every agent, as the DaemonSet mounts it; ``""`` checks the target's own address instead), and
the collector's bearer token (``token_source``, called before every scrape: the in-cluster
ServiceAccount token or ``--agent-token-file``, re-read when it changes) or a client certificate.
A certificate that does not verify fails the scrape before any request is sent (reason
``tls_verify``): the token never reaches an impostor. ``insecure_tls`` skips the verification
(tests); ``insecure_http`` scrapes plain HTTP and sends no token (simulated agents).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kcms.kube.client import KubeClient
from kcms.tokenfile import TokenFile

__all__ = ["DEFAULT_AGENT_SERVER_NAME", "AgentAccess", "TokenFile", "agent_access", "file_stamp"]

DEFAULT_AGENT_SERVER_NAME = "kcms-agent.kube-system.svc"


def file_stamp(path: str) -> tuple[int, int, int] | None:
    """What changes when the file is replaced or rewritten (None: missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


@dataclass(frozen=True, slots=True)
class AgentAccess:
    """How the collector reaches agents (see the module docstring)."""

    insecure_http: bool = False
    ca_file: str | None = None  # None: the system trust store
    server_name: str = DEFAULT_AGENT_SERVER_NAME  # "": the target's address must be in the certificate
    insecure_tls: bool = False
    token_source: Callable[[], str | None] | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context; raises OSError or ssl.SSLError for unreadable files."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.insecure_tls:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_file:
            ctx.load_cert_chain(self.client_cert_file, self.client_key_file or None)
        return ctx


def agent_access(args: Any, kube: KubeClient | None) -> AgentAccess:
    """The :class:`AgentAccess` of the ``--agent-*`` flags in ``args`` (see kcms/cmd/flags_sources.py); the token
    defaults to ``kube``'s credential (in a cluster, the ServiceAccount token, re-read as it rotates)."""
    if getattr(args, "agent_insecure_http", False):
        return AgentAccess(insecure_http=True)
    token_file = getattr(args, "agent_token_file", "")
    token_source = TokenFile(token_file) if token_file else (kube.bearer_token if kube is not None else None)
    return AgentAccess(
        ca_file=getattr(args, "agent_ca_file", "") or None,
        server_name=getattr(args, "agent_tls_server_name", DEFAULT_AGENT_SERVER_NAME),
        insecure_tls=getattr(args, "agent_insecure_tls", False),
        token_source=token_source,
        client_cert_file=getattr(args, "agent_client_certificate", "") or None,
        client_key_file=getattr(args, "agent_client_key", "") or None,
    )
