"""A real training loop (issue 43, DESIGN.md §9.4): a small PyTorch language model trained on
the CPU with a DataLoader slowed on purpose and a checkpoint every 8 steps, reporting through
gpufleet_hook to the real agent's socket, then through the ingest service and the rollup.

What the loop measured around the same calls (its own clock, apart from the hook's) is what
the server stores: the data-starved and checkpoint shares within 5 %. The flops that
``gpufleet_hook.pytorch.count_flops`` counts with ``FlopCounterMode`` are the analytical count:
every linear layer's input needs a gradient (an embedding comes first), so a training step
does 2 × weights × tokens of matrix multiplication forward and twice that backward (the
input's and the weights' gradients): 6 × the linear layers' weights × tokens (biases, the
ReLU, the loss and the embedding's lookup are not matrix multiplications).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from . import procfs as pf
from .test_agent_hook_socket import HookNode, check_server_accepts
from .test_agent_shares import START, T0, uuid

ROOT = Path(__file__).resolve().parents[2]
VOCAB, DIM, HIDDEN, BATCH, SEQ = 64, 32, 96, 8, 16
STEPS, CKPT_EVERY = 24, 8

LOOP = """
import json, os, sys, tempfile, time
sys.stdin.readline()
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from gpufleet_hook import Hook
from gpufleet_hook.pytorch import count_flops

VOCAB, DIM, HIDDEN, BATCH, SEQ, STEPS, CKPT_EVERY = map(int, sys.argv[2:9])
torch.manual_seed(0)
model = nn.Sequential(
    nn.Embedding(VOCAB, DIM), nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, VOCAB)
)

class Slow(Dataset):  # a data pipeline that keeps the GPU waiting
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.randint(0, VOCAB, (SEQ,)), torch.randint(0, VOCAB, (SEQ,))

loader = iter(DataLoader(Slow(), batch_size=BATCH))
loss_fn = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x0, y0 = next(loader)
flops = count_flops(model, x0, loss=lambda out: loss_fn(out.reshape(-1, VOCAB), y0.reshape(-1)))
ballast = torch.zeros(2_000_000)  # a checkpoint worth measuring: 8 MB written and synced
path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
hook = Hook(model="tiny-lm", socket_path=sys.argv[1], flops_per_step=flops)
data = ckpt = 0.0
t0 = time.perf_counter()
for step in range(STEPS):
    t = time.perf_counter()
    with hook.data_wait():
        x, y = next(loader)
    data += time.perf_counter() - t
    with hook.compute():
        opt.zero_grad()
        loss = loss_fn(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
    if step % CKPT_EVERY == CKPT_EVERY - 1:
        t = time.perf_counter()
        with hook.checkpoint(nbytes=ballast.numel() * 4):
            with open(path, "wb") as f:
                torch.save({"model": model.state_dict(), "ballast": ballast}, f)
                f.flush()
                os.fsync(f.fileno())
        ckpt += time.perf_counter() - t
    hook.step(samples=BATCH, tokens=BATCH * SEQ)
wall = time.perf_counter() - t0
hook.flush()
print(json.dumps({"data": data, "ckpt": ckpt, "wall": wall, "flops": flops,
                  "sent": hook.sent, "dropped": hook.dropped}))
"""


def torch_available() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        from tests.conftest import service_missing

        service_missing("torch (pip install -e '.[dev]' installs the CPU wheel, torch==2.13.0)")


def test_flopcountermode_counts_6_x_weights_x_tokens() -> None:
    torch_available()
    import torch
    from gpufleet_hook.pytorch import count_flops
    from torch import nn

    model = nn.Sequential(
        nn.Embedding(VOCAB, DIM), nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, VOCAB)
    )
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    weights = DIM * HIDDEN + HIDDEN * VOCAB  # 3,072 + 6,144 = 9,216 (no biases)
    tokens = BATCH * SEQ  # 128
    assert count_flops(model, x) == 6 * weights * tokens  # 7,077,888
    # forward alone: 2 × weights × tokens; the gradients are cleared after counting
    assert count_flops(model, x, backward=False) == 2 * weights * tokens
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.django_db
def test_a_real_training_loop_through_the_agent_and_the_server(tmp_path: Path) -> None:
    torch_available()
    from fleet.models import Node as ServerNode
    from telemetry.efficiency import job_efficiency
    from telemetry.ingest import sample_batch_ingest
    from telemetry.rollup import rollup_run

    node = HookNode(tmp_path)  # job 48213 holds GPUs 0 and 1
    out: list[dict[str, Any]] = []
    measured: dict[str, Any] = {}
    for t in range(T0, T0 + 11):
        if t == T0 + 3:
            loop = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    LOOP,  # gpufleet_hook as the project installs it
                    node.sock,
                    *map(str, (VOCAB, DIM, HIDDEN, BATCH, SEQ, STEPS, CKPT_EVERY)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            node.proc.add(loop.pid, pf.SLURM_V2, uid=1000)  # a process of job 48213
            got, _ = loop.communicate("go\n", timeout=120)
            assert loop.returncode == 0
            measured = json.loads(got.strip().splitlines()[-1])
        node.clock.set(t + 0.003)
        out.extend(node.agent.tick(t))
    assert (measured["sent"], measured["dropped"]) == (1, 0)
    assert measured["flops"] == 6 * (DIM * HIDDEN + HIDDEN * VOCAB) * BATCH * SEQ
    samples = [s for s in out if s["start"] == START]
    jobs = {s["gpu"]: s["job"] for s in samples if "job" in s}
    assert set(jobs) == {uuid(0), uuid(1)}  # the job's two GPUs, not job 48214's
    for s in samples:
        check_server_accepts(s)

    # Through the server: the ingest service, the rollup, the efficiency figures.
    server_node = ServerNode.objects.create(hostname="gpu-hook-01")
    payload = {
        "node": node.agent.node_info(),
        "gpus": node.agent.source.inventory(),
        "samples": samples,
    }
    result = sample_batch_ingest(
        node_id=server_node.pk, payload_bytes=json.dumps(payload).encode(), now=timezone.now()
    )
    assert result.accepted == len(samples) and not result.rejected
    rollup_run(wait=True)
    hour = dt.datetime.fromtimestamp(T0, dt.UTC)
    (row,) = job_efficiency(start=hour, end=hour + dt.timedelta(hours=1), group_by="model")
    assert row.key == "tiny-lm"
    assert row.steps == STEPS and row.tokens == STEPS * BATCH * SEQ
    starved, checkpointing = (
        measured["data"] / measured["wall"],
        measured["ckpt"] / measured["wall"],
    )
    assert starved > 0.2 and checkpointing > 0.005  # the loop was slowed and checkpointed
    assert row.data_starved_share == pytest.approx(starved, rel=0.05)
    assert row.checkpoint_share == pytest.approx(checkpointing, rel=0.05)
