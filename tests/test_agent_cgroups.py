"""The cgroup v2 source: real directory trees shaped like the kubelet's (systemd and cgroupfs drivers)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fakeobjects import make_pod
from test_agent_buffer import parse_agent_text

from kcms.agent.buffer import SampleBuffer
from kcms.agent.cgroups import CgroupSource, find_pod_cgroups
from kcms.agent.pods import AgentPod, agent_pod_from_json
from kcms.model import ObjectRef

NOW = 1_700_000_000.0

CPU_STAT = """usage_usec 1500000
user_usec 1000000
system_usec 500000
core_sched.force_idle_usec 0
nr_periods 100
nr_throttled 7
throttled_usec 250000
nr_bursts 0
burst_usec 0
"""
MEMORY_STAT = """anon 52428800
file 31457280
kernel 1048576
kernel_stack 65536
shmem 0
active_anon 0
inactive_anon 52428800
active_file 10485760
inactive_file 20971520
unevictable 0
pgfault 12345
"""
IO_STAT = """8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0
253:0 rbytes=100 wbytes=200 rios=3 wios=4 dbytes=0 dios=0
"""
CPU_PRESSURE = """some avg10=1.50 avg60=0.80 avg300=0.20 total=123456
full avg10=0.50 avg60=0.10 avg300=0.00 total=65432
"""
MEMORY_PRESSURE = """some avg10=0.00 avg60=0.00 avg300=0.00 total=10
full avg10=0.00 avg60=0.00 avg300=0.00 total=5
"""


def write_cgroup(path: Path, scale: int = 1, **overrides: str) -> None:
    """A cgroup directory with the files the kernel writes (values multiplied by ``scale``)."""
    path.mkdir(parents=True, exist_ok=True)
    files = {
        "cpu.stat": "".join(
            f"{k} {int(v) * scale}\n" for k, v in (line.split() for line in CPU_STAT.splitlines())
        ),
        "memory.current": f"{104857600 * scale}\n",
        "memory.stat": MEMORY_STAT,
        "io.stat": IO_STAT,
        "cpu.pressure": CPU_PRESSURE,
        "memory.pressure": MEMORY_PRESSURE,
        "cgroup.procs": "",
        "memory.max": "max\n",
    }
    files.update(overrides)
    for name, text in files.items():
        (path / name).write_text(text)


def pod(
    namespace: str, name: str, containers: tuple[str, ...], uid: str | None = None, **ann: str
) -> AgentPod:
    obj = make_pod(namespace, name, "node-a", containers=containers)
    obj["metadata"]["uid"] = uid or str(uuid.uuid4())
    obj["metadata"]["annotations"] = dict(ann)
    for cs in obj["status"]["containerStatuses"]:
        cs["containerID"] = "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex, as containerd
    return agent_pod_from_json(obj)


def cid(p: AgentPod, container: str) -> str:
    return next(i for i, n in p.containers.items() if n == container)


def collect(source: CgroupSource) -> list:
    b = SampleBuffer()
    b.add_many(source.collect(NOW))
    _, samples = parse_agent_text(b.render().decode())
    return samples


def values(samples: list, obj: ObjectRef, labels: tuple = ()) -> dict[str, float]:
    return {m: v for m, o, lb, v, _ in samples if o == obj and lb == labels}


def test_systemd_layout_pod_and_container_values(tmp_path: Path) -> None:
    web = pod("default", "web-1", ("app", "sidecar"))
    slice_ = tmp_path / "kubepods.slice" / "kubepods-burstable.slice"
    pod_dir = slice_ / f"kubepods-burstable-pod{web.uid.replace('-', '_')}.slice"
    write_cgroup(pod_dir, scale=3)
    write_cgroup(pod_dir / f"cri-containerd-{cid(web, 'app')}.scope", scale=2)
    write_cgroup(pod_dir / f"cri-containerd-{cid(web, 'sidecar')}.scope", scale=1)
    write_cgroup(pod_dir / f"cri-containerd-{'ab' * 32}.scope", scale=5)  # the sandbox: not a container
    write_cgroup(tmp_path / "system.slice" / "containerd.service")  # not a pod
    source = CgroupSource(lambda: [web], str(tmp_path))
    samples = collect(source)
    obj = ObjectRef("pods", "default", "web-1")

    total = values(samples, obj)
    assert total["container_cpu_usage_seconds_total"] == pytest.approx(4.5)
    assert total["container_cpu_user_seconds_total"] == pytest.approx(3.0)
    assert total["container_cpu_system_seconds_total"] == pytest.approx(1.5)
    assert total["container_cpu_cfs_periods_total"] == 300
    assert total["container_cpu_cfs_throttled_periods_total"] == 21
    assert total["container_cpu_cfs_throttled_seconds_total"] == pytest.approx(0.75)
    assert total["container_memory_usage_bytes"] == 3 * 104857600
    assert total["container_memory_working_set_bytes"] == 3 * 104857600 - 20971520
    assert total["container_memory_rss"] == 52428800
    assert total["container_memory_cache"] == 31457280
    assert total["container_fs_reads_bytes_total"] == 4196
    assert total["container_fs_writes_bytes_total"] == 8392
    assert total["container_fs_reads_total"] == 4
    assert total["container_fs_writes_total"] == 6
    assert total["container_pressure_cpu_some_avg10"] == 1.5
    assert total["container_pressure_cpu_full_avg10"] == 0.5
    assert total["container_pressure_cpu_some_seconds_total"] == pytest.approx(0.123456)
    assert total["container_pressure_cpu_full_seconds_total"] == pytest.approx(0.065432)
    assert total["container_pressure_memory_some_seconds_total"] == pytest.approx(1e-5)
    assert "container_pressure_io_some_avg10" not in total  # io.pressure absent: skipped, not an error

    app = values(samples, obj, (("container", "app"),))
    sidecar = values(samples, obj, (("container", "sidecar"),))
    assert app["container_cpu_usage_seconds_total"] == pytest.approx(3.0)
    assert sidecar["container_cpu_usage_seconds_total"] == pytest.approx(1.5)
    assert app["container_memory_working_set_bytes"] == 2 * 104857600 - 20971520
    labelsets = {lb for _, o, lb, _, _ in samples}
    assert labelsets == {(), (("container", "app"),), (("container", "sidecar"),)}  # no pause container
    assert {o for _, o, _, _, _ in samples} == {obj}
    assert all(ms == NOW * 1000 for *_, ms in samples)
    assert source.errors == {} and source.unknown_pods == 0


def test_cgroupfs_layout_guaranteed_and_besteffort(tmp_path: Path) -> None:
    g = pod("prod", "db-0", ("db",))
    be = pod("batch", "job-x", ("worker",))
    write_cgroup(tmp_path / "kubepods" / f"pod{g.uid}")
    write_cgroup(tmp_path / "kubepods" / f"pod{g.uid}" / cid(g, "db"))
    write_cgroup(tmp_path / "kubepods" / "besteffort" / f"pod{be.uid}" / cid(be, "worker"), scale=4)
    assert sorted(find_pod_cgroups(str(tmp_path))) == sorted(
        [
            (g.uid, str(tmp_path / "kubepods" / f"pod{g.uid}")),
            (be.uid, str(tmp_path / "kubepods" / "besteffort" / f"pod{be.uid}")),
        ]
    )
    samples = collect(CgroupSource(lambda: [g, be], str(tmp_path)))
    db = values(samples, ObjectRef("pods", "prod", "db-0"), (("container", "db"),))
    worker = values(samples, ObjectRef("pods", "batch", "job-x"), (("container", "worker"),))
    assert db["container_cpu_usage_seconds_total"] == pytest.approx(1.5)
    assert worker["container_cpu_usage_seconds_total"] == pytest.approx(6.0)
    assert values(samples, ObjectRef("pods", "batch", "job-x")) == {}  # its pod dir has no files


def test_kind_nested_layout_and_static_pod_by_mirror_hash(tmp_path: Path) -> None:
    config_hash = uuid.uuid4().hex  # a static pod's cgroup carries its config hash
    static = pod("kube-system", "etcd-node-a", ("etcd",), **{"kubernetes.io/config.mirror": config_hash})
    base = tmp_path / "kubelet.slice" / "kubelet-kubepods.slice"
    write_cgroup(
        base / f"kubelet-kubepods-pod{config_hash}.slice" / f"cri-containerd-{cid(static, 'etcd')}.scope"
    )
    samples = collect(CgroupSource(lambda: [static], str(tmp_path)))
    etcd = values(samples, ObjectRef("pods", "kube-system", "etcd-node-a"), (("container", "etcd"),))
    assert etcd["container_memory_usage_bytes"] == 104857600


def test_malformed_files_are_skipped_and_counted_unknown_pods_skipped(tmp_path: Path) -> None:
    web = pod("default", "web-1", ("app",))
    stranger_uid = str(uuid.uuid4())
    slice_ = tmp_path / "kubepods.slice" / "kubepods-besteffort.slice"
    pod_dir = slice_ / f"kubepods-besteffort-pod{web.uid.replace('-', '_')}.slice"
    write_cgroup(
        pod_dir,
        **{
            "cpu.stat": "usage_usec lots\n",
            "memory.current": "max\n",
            "io.stat": "8:0 rbytes4096\n",
            "cpu.pressure": "some avg10=oops total=1\n",
            "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
        },
    )
    (pod_dir / "memory.stat").write_bytes(b"anon \xff\xfe\n")
    write_cgroup(pod_dir / f"cri-containerd-{cid(web, 'app')}.scope")
    write_cgroup(slice_ / f"kubepods-besteffort-pod{stranger_uid.replace('-', '_')}.slice")
    source = CgroupSource(lambda: [web], str(tmp_path))
    samples = collect(source)
    obj = ObjectRef("pods", "default", "web-1")
    # the broken pod-level files gave nothing, the good one did, and the container is intact
    assert values(samples, obj) == {
        "container_pressure_memory_some_avg10": 0.0,
        "container_pressure_memory_some_seconds_total": pytest.approx(7e-6),
    }
    assert values(samples, obj, (("container", "app"),))["container_cpu_usage_seconds_total"] == 1.5
    assert source.errors == {
        "cpu.stat": 1,
        "memory.current": 1,
        "memory.stat": 1,
        "io.stat": 1,
        "cpu.pressure": 1,
    }
    assert source.unknown_pods == 1
    assert {o for _, o, _, _, _ in samples} == {obj}


def test_missing_root_and_vanishing_directories_yield_nothing(tmp_path: Path) -> None:
    assert CgroupSource(lambda: [], str(tmp_path / "nope")).collect(NOW) == []
    web = pod("default", "web-1", ("app",))
    pod_dir = tmp_path / "kubepods" / f"pod{web.uid}"
    pod_dir.mkdir(parents=True)  # a pod cgroup whose files are gone already
    source = CgroupSource(lambda: [web], str(tmp_path))
    assert source.collect(NOW) == [] and source.errors == {}
