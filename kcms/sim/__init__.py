"""Simulated kubelets: HTTPS servers on loopback with known true usage (run alone by ``kcms simulate``,
kcms/cmd/simulate.py)."""

from kcms.sim.cluster import SimulatedCluster
from kcms.sim.kubelet import MODES, render_resource_metrics, render_summary

__all__ = [
    "MODES",
    "SimulatedCluster",
    "render_resource_metrics",
    "render_summary",
]
