"""The KCMS node agent (``kcms agent``, a DaemonSet).

It collects this node's pod and container usage (cgroup v2), node metrics (psutil), the Prometheus
endpoints of annotated pods and OTLP/HTTP pushes into a short buffer (:mod:`kcms.agent.buffer`),
and serves it on ``GET /metrics`` in the KCMS agent exposition format for the collector of agents.
"""
