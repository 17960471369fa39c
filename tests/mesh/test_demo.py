"""`make demo` runs `python -m populi_p2p.demo`: it must work and clean up after itself.

One run checks every part: the mesh and its kill -9, the streamed chat completion that
survives its serving node's kill -9 (through the official `openai` client), a stream
from llama.cpp's llama-server when it is built (`make engine`), a deployment of 2 replicas
(on llama-server when it is built) whose replica is placed again after its owner's
kill -9, with streams giving the same text throughout, and tasks
that run on their owners, one of them again at the next epoch after its owner's kill -9,
resuming from its checkpoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.node.harness import REPO


def _llama_server_built() -> bool:
    from populi_p2p.inference.llama_server import LlamaServerError, find_llama_server

    try:
        find_llama_server()
    except LlamaServerError:
        return False
    return True


@pytest.mark.slow
def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.demo", "--long-task", "4"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "did not finish" not in out, out
    assert out.count("NAME ") == 2  # the table, before and after
    assert "agree node3 is dead" in out
    # The dashboard's address is printed; stdin is not a terminal, so nothing waits.
    assert "dashboard: http://127.0.0.1:" in out
    after = out.split("kill -9 node3")[1]
    assert any(line.startswith("node3") and " dead " in line for line in after.splitlines())

    # Inference: the stream came from an engine node, that node was killed mid-stream,
    # and the text arrived whole, once, in order (w0..w29), finished by the other node.
    served = re.search(r"stream from (node\d) \(x-populi-node\)", out)
    assert served and served.group(1) in ("node5", "node6"), out
    assert f"kill -9 {served.group(1)} mid-stream" in out
    other = "node6" if served.group(1) == "node5" else "node5"
    words = re.findall(r"\bw(\d+)\b", out.split("(x-populi-node)")[1].split("stream finished")[0])
    assert [int(w) for w in words] == list(range(30)), words
    assert "30 pieces, text intact, no repeat" in out
    assert re.search(rf"route attempts: {served.group(1)}: broken.*; {other}: served", out), out

    # A real engine when llama-server is built (`make test` builds it): a stream from
    # node2 came from the llama-server node1 started itself (--gguf), every token.
    if _llama_server_built():
        assert "real engine: 16 tokens from node1 through node2" in out, out
    else:
        assert "real engine: llama-server is not built" in out, out

    # A deployment: 2 replicas of the tiny model serve on two nodes; one replica's owner
    # is killed; the replica serves again on a third node; requests answered throughout.
    part = out.split("-- deploy:")[1].split("-- tasks:")[0]
    first = re.findall(r"tiny\s+#(\d)\s+(node\d)\s+\w+\s+serving", part.split("kill -9")[0])
    assert sorted(i for i, _ in first) == ["0", "1"] and len({n for _, n in first}) == 2, part
    victim = re.search(r"kill -9 (node\d) \(owner of a replica", part)
    assert victim and victim.group(1) in {n for _, n in first}, part
    after = re.findall(r"tiny\s+#(\d)\s+(node\d)\s+\w+\s+serving", part.split("placed again")[1])
    nodes_after = {n for _, n in after}
    assert len(after) == 2 and victim.group(1) not in nodes_after and len(nodes_after) == 2, part
    # Streams before, during and after (two at once, spread over both replicas), the
    # same text (temperature 0): llama.cpp's llama-server on the fetched model when it
    # is built, else the stand-in's words. The API node deployed, drained: it holds no
    # replica, so every stream went through a relay to an owner.
    texts = re.findall(r"(?:before|meanwhile|after): '([^']*)' from (node\d)", part)
    assert len(texts) == 4 and len({t for t, _ in texts}) == 1 and texts[0][0], part
    assert "node2" not in {n for _, n in texts} and victim.group(1) != "node2", part
    assert "4 streams, the same text" in part, part
    assert "undeployed tiny: 2 replica(s) stopped" in part, part
    if _llama_server_built():
        assert "runs llama.cpp's llama-server on it" in part, part
        assert re.fullmatch(r"[a-z ]+", texts[0][0]) and not texts[0][0].startswith("w0")
    else:
        assert "llama-server is not built (make engine): stand-in" in part, part
        assert texts[0][0] == " ".join(f"w{i}" for i in range(12)), texts

    # Tasks: the short ones succeeded (the CLI's table), the long one ran, its owner was
    # killed, and it ran again at a later epoch on another node and succeeded.
    table = out.split("populi-node tasks:")[1].split("long task")[0]
    rows = [line for line in table.splitlines() if " batch " in line]  # not the replicas
    assert len(rows) == 3 and all(" succeeded " in r for r in rows), table
    killed = re.search(r"running at epoch (\d+) on (node\d); kill -9 (node\d)", out)
    assert killed and killed.group(2) == killed.group(3), out
    again = re.search(r"running again at epoch (\d+) on (node\d)", out)
    assert again and again.group(2) != killed.group(2), out
    assert int(again.group(1)) > int(killed.group(1)), out
    # It resumed from its checkpoint, not from 0, and counted to the end.
    resumed = re.search(
        r"output 'resumed from epoch (\d+) at step (\d+)\\ndone at step (\d+)'", out
    )
    assert resumed and resumed.group(1) == killed.group(1), out
    assert 0 < int(resumed.group(2)) < int(resumed.group(3)), out
    assert re.search(r"checkpoint #\d+ of epoch \d+: \d+ bytes, held by node\d", out), out
    assert f"epoch {killed.group(1)}: owner {killed.group(2)}, " in out
    assert f"epoch {again.group(1)}: owner {again.group(2)}, succeeded, exit 0" in out

    # Nothing left behind in its temporary directory.
    assert not any(p.name.startswith("populi-demo-") for p in tmp_path.iterdir())
