"""Real multi-process training: torchrun + gloo + DistributedDataParallel over a Loader."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import pack_jpeg_and_raw

SCRIPT = Path(__file__).parent.parent / "ddp_train.py"
TORCHRUN_DEADLINE = 240  # a hang guard only: a rank waiting forever in all-reduce


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("ddp"), 50, 5, seed=9,
                             shard_size="40KB")["raw"]


def _torchrun(nproc: int, raw, out: Path, *args) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(SCRIPT), str(raw), str(out), *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCHRUN_DEADLINE,
                          env=env)
    if done.returncode != 0:  # each rank's stages and, if it crashed, its threads' stacks
        logs = "".join(f"--- rank {r}: {log.read_text()}" for r in range(nproc)
                       if (log := Path(f"{out}.{r}.log")).exists())
        pytest.fail(done.stdout[-3000:] + done.stderr[-3000:] + logs)


def _records(out: Path, nproc: int) -> list:
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(nproc)]


def test_ddp_ranks_read_disjoint_complete_epochs_with_equal_steps(raw, tmp_path):
    out = tmp_path / "run"
    _torchrun(3, raw, out)  # 50 samples, 3 ranks, batch 8: parts of 16, 17 and 17
    recs = _records(out, 3)
    assert sorted(r["rank"] for r in recs) == [0, 1, 2]
    assert all(r["world_size"] == 3 for r in recs)  # the Loader was built before init
    for epoch in ("0", "1"):
        steps = [len(r["epochs"][epoch]) for r in recs]
        assert steps == [3, 3, 3]  # equal batch counts: DDP never waits on a rank
        seen = [i for r in recs for step in r["epochs"][epoch] for i in step]
        assert sorted(seen) == list(range(50))  # disjoint and exactly the epoch
    order0 = [i for r in recs for s in r["epochs"]["0"] for i in s]
    order1 = [i for r in recs for s in r["epochs"]["1"] for i in s]
    assert order0 != order1  # set_epoch reshuffles across ranks


def test_ddp_job_resumes_on_another_number_of_ranks(raw, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _torchrun(2, raw, first, "--steps", 2)  # 2 ranks stop after 2 steps of epoch 0
    _torchrun(3, raw, second, "--resume", f"{first}.state")
    done = [i for r in _records(first, 2) for s in r["epochs"]["0"] for i in s]
    recs = _records(second, 3)
    rest = [i for r in recs for s in r["epochs"]["0"] for i in s]
    assert len(done) == 2 * 2 * 8 and not set(done) & set(rest)
    assert sorted(done + rest) == list(range(50))  # the rest of the epoch, exactly once
    assert len({len(r["epochs"]["0"]) for r in recs}) == 1
    assert sorted(i for r in recs for s in r["epochs"]["1"] for i in s) == list(range(50))
