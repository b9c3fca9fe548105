"""Serve a simulator's inventory through the test suite's fake Kubernetes API server.

    python bench/fake_kube_apiserver.py INVENTORY.json KUBECONFIG_OUT

So that a benchmarked `kcms standalone` learns its nodes and pods the production way (paged
LIST, then WATCH) rather than from a file. Prints "ready" once the kubeconfig is written.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakeapi import FakeKubeAPI  # noqa: E402


async def main(objects: list[dict], kubeconfig: str) -> None:
    fake = FakeKubeAPI(trustme.CA())
    for obj in objects:
        fake.upsert(obj)
    async with fake:
        fake.write_kubeconfig(kubeconfig)
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(orjson.loads(Path(sys.argv[1]).read_bytes())["items"], sys.argv[2]))
