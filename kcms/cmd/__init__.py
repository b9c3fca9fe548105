"""The process entry points: one module per ``kcms`` sub-command, as metrics-server keeps ``cmd/``.

``main.py`` is the ``kcms`` command (it parses the sub-command's flags and starts it); the flags
shared by several sub-commands are in ``flags.py`` (kubelet, serving, authentication, Kubernetes
access, logging), ``flags_sources.py`` (custom-metrics sources: series store, agents, Prometheus)
and ``flags_ha.py`` (store, collector and server of the HA modes). Each other module wires and runs
one sub-command: ``standalone``, ``store``, ``collector``, ``server``, ``agent``, ``simulate`` and
``demo`` (with ``demo_prometheus`` for ``kcms demo --prometheus``). ``kcms top`` is the kubectl
plugin's (kcms/kubectl/).

Nothing below this package imports it: it sits at the top of the flow.
"""
