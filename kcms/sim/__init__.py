"""Simulated kubelets (``kcms simulate``): HTTPS servers on loopback with known true usage."""

from kcms.sim.cli import add_simulate_arguments, simulate_main
from kcms.sim.cluster import SimulatedCluster
from kcms.sim.kubelet import MODES, render_resource_metrics, render_summary

__all__ = [
    "MODES",
    "SimulatedCluster",
    "add_simulate_arguments",
    "render_resource_metrics",
    "render_summary",
    "simulate_main",
]
