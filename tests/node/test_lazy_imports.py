"""Start-up CPU (issue 8): what a daemon does not need to answer its API is imported later;
idle memory (issue 23): what a plain member never needs is not imported at all.

Each check runs in a fresh interpreter (this test process has imported everything).
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Modules a node without ``--engine``, ``--api-listen``, ``--mdns`` or Tailscale must
#: not load before its API answers: the HTTP client, the inference package, the GPU
#: probe, mDNS and prometheus-client (the first scrape loads it).
HEAVY = (
    "httpx",
    "populi_p2p.inference",
    "populi_p2p.gpu._monitor",
    "pynvml",
    "zeroconf",
    "prometheus_client",
)

#: Modules a plain member, started and idle, has no use for until a feature or an event
#: asks (`benchmarks/rss_bench.py` measures each): importlib.metadata (the version is
#: `populi_p2p._version.VERSION`), tarfile (an artifact directory), zipfile (what
#: importlib.resources' readers load: the dashboard's first page, the first TLS
#: connection's CA bundle), zeroconf, prometheus-client, and pynvml where there is no
#: NVIDIA library to open.
IDLE_ABSENT = (
    "importlib.metadata",
    "tarfile",
    "zipfile",
    "zeroconf",
    "prometheus_client",
    *(() if ctypes.util.find_library("nvidia-ml") else ("pynvml",)),
)


def _run(code: str) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer: dict[str, list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def test_importing_the_cli_and_the_node_loads_none_of_them() -> None:
    loaded = _run(f"""
        import json, sys
        import populi_p2p.cli, populi_p2p.node
        print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
    """)
    assert loaded["heavy"] == []


def test_a_node_answers_its_api_before_loading_them(tmp_path: Path) -> None:
    """`up` is stopped the moment the API is serving (where the node would go on to
    the GPU probe and node-to-node HTTP): by then none of them is loaded."""
    loaded = _run(f"""
        import json, sys
        from pathlib import Path
        import trio
        from tests.node.harness import Mesh
        import populi_p2p.cli as cli
        from populi_p2p.node import Node
        from populi_p2p.services.gpus import GpuService

        state = Mesh(Path({str(tmp_path)!r})).prepare("lazy")
        seen = {{}}

        async def stop_here(self, nursery, *args):
            seen["heavy"] = [m for m in {HEAVY!r} if m in sys.modules]
            seen["served_by"] = [m for m in ("hypercorn",) if m in sys.modules]
            nursery.cancel_scope.cancel()

        async def no_probe(self, *, task_status=trio.TASK_STATUS_IGNORED):
            task_status.started()

        Node._start_http = stop_here
        GpuService.run = no_probe
        code = cli.main(["up", "--state-dir", str(state), "--bind", "127.0.0.1",
                         "--port", "0", "--overlay", "none", "--preset", "local"])
        assert code == 0, code
        print(json.dumps(seen))
    """)
    assert loaded["served_by"] == ["hypercorn"]  # the API was serving when this looked
    assert loaded["heavy"] == []


def test_a_plain_member_started_does_not_load_what_it_does_not_use(tmp_path: Path) -> None:
    """Looked at when the node starts joining: its API and peer API serve, the GPU
    probe has reported, so everything a plain member loads at start-up is loaded."""
    loaded = _run(f"""
        import json, os, sys
        from pathlib import Path
        import trio
        from tests.node.harness import Mesh
        import populi_p2p.cli as cli
        from populi_p2p.services.discovery import Discovery

        state = Mesh(Path({str(tmp_path)!r})).prepare("idle")

        async def look_when_joining(self, events, *, after=None, wait_max=0.0, **kwargs):
            await after.wait()  # the first GPU report: the probe modules are in
            absent = {IDLE_ABSENT!r}
            seen = {{"loaded": [m for m in absent if m in sys.modules],
                     "started": [m for m in ("hypercorn", "populi_p2p.gpu._monitor",
                                             "populi_p2p.services.inference_host")
                                 if m in sys.modules]}}
            print(json.dumps(seen), flush=True)
            os._exit(0)

        Discovery.run = look_when_joining
        cli.main(["up", "--state-dir", str(state), "--bind", "127.0.0.1",
                  "--port", "0", "--overlay", "none", "--preset", "local"])
    """)
    assert loaded["started"] == [  # what it looked at had started
        "hypercorn",
        "populi_p2p.gpu._monitor",
        "populi_p2p.services.inference_host",
    ]
    assert loaded["loaded"] == []
