"""Workers(kind="ray"): batches built by Ray actors on a real local cluster (``ray start``
nodes, tests/raycluster.py), the same as thread workers build; an actor killed and a node
killed in the middle of an epoch cost only the batches they held; resume and elastic resume;
a cluster that cannot be reached or has no CPUs for the actors is named; an s3:// data set
that each actor fetches itself. Drivers run in forked children (tests/helpers.py
``in_forked_child``: one Ray session per process) or, next to an S3 client, in a subprocess.
The golden cases with Ray actors are in tests/batch/test_golden.py."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest

pytest.importorskip("ray")

import golden  # noqa: E402
from helpers import in_forked_child, upload_folder  # noqa: E402
from raycluster import free_ports, session_pids  # noqa: E402

from dlpack_io.reader import Loader, Workers  # noqa: E402

PINNED = golden.load()
CASE = golden.RESUME_CASE  # RandomResizedCrop + flip + Normalize, batch 8, 40 photos


def _loader(kind: str = "ray", **extra) -> Loader:
    """RESUME_CASE's loader with golden.WORKERS[kind] (or golden.RAY) and ``extra``."""
    set_name, kwargs = golden.cases()[CASE]
    return Loader(golden.dataset(set_name), **golden.options(kwargs, kind, **extra))


def test_ray_settings_are_checked():
    with pytest.raises(ValueError, match="kind='ray' only"):
        Workers(ray_address="head:6379")
    with pytest.raises(ValueError, match="max_restarts"):
        Workers(kind="ray", ray_options={"max_restarts": 3})
    with pytest.raises(TypeError, match="dict of Ray actor options"):
        Workers(kind="ray", ray_options="SPREAD")
    with pytest.raises(ValueError, match="give Ray workers a count"):
        _loader(num_workers="auto")


def test_a_cluster_that_cannot_be_reached_is_named():
    """Nothing listens there: an error in seconds naming the address and the fix (Ray
    itself would retry for minutes)."""
    from dlpack_io.reader.batch.rayworkers import RayClusterError

    address = f"127.0.0.2:{free_ports(1)[0]}"
    with _loader(workers={"ray_address": address}) as loader:
        with pytest.raises(RayClusterError, match=f"cannot reach the Ray cluster at {address}"
                                                  r".*ray start --head"):
            next(iter(loader))


@in_forked_child
def test_batches_come_through_the_object_store_with_the_stats(ray_address):
    """Identical to thread workers; stats() count the actors' CPU, the bytes moved (the
    float32 batches exactly) and no prefetch in the training process."""
    with _loader() as loader:
        got = golden.epochs(loader, 1)
        stats = loader.stats()
    assert got == PINNED["cases"][CASE][:1]
    assert stats.worker_kind == "ray" and stats.rebuilt == 0
    assert stats.moved_bytes == stats.images * 3 * 32 * 32 * 4
    assert 0 < stats.remote_cpu_s <= stats.cpu_s and stats.fetched_bytes == 0
    assert stats.transfer_s > 0 and stats.decode_s > 0
    assert "Ray: 12.3 KB/image moved" in str(stats)


@in_forked_child
def test_a_killed_actor_costs_only_its_batches(ray_address, tmp_path, caplog):
    """An actor SIGKILLed while it builds a batch of epoch 0: its batches are built again
    by the other actor, identical, and stats() count them; a new actor replaces it."""
    driver, marker = os.getpid(), tmp_path / "killed"
    with _loader("threads") as loader:
        victim = int(loader.indices(0)[2 * loader.batch_size + 3])  # inside batch 2

    def die_once(pixels):  # in an actor (not this process), at the victim, once
        if os.getpid() != driver and marker.name not in os.listdir(marker.parent):
            import numpy as np

            if np.array_equal(pixels, victim_pixels):
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
        return pixels
    victim_pixels = golden.dataset("photos")[victim][0]
    with _loader(sample_transform=die_once) as loader:
        with caplog.at_level(logging.WARNING, logger="dlpack_io.reader.batch.rayworkers"):
            got = golden.epochs(loader)
        stats = loader.stats().run
    assert marker.exists(), "no actor reached the victim sample"
    with _loader("threads", sample_transform=die_once) as loader:
        assert got == golden.epochs(loader)
    assert 1 <= stats.rebuilt <= 4  # the batch it was building and those queued behind it
    assert "was lost" in caplog.text and "built again by the other actors" in caplog.text


@in_forked_child
def test_a_bad_sample_raises_or_is_skipped_as_with_threads(ray_address):
    """A sample_transform that fails on one sample, in an actor: SampleError naming the
    sample in the training process, after the batches before it; with on_error="skip" the
    batches and the account of thread workers."""
    import numpy as np

    from dlpack_io.reader.batch.errors import SampleError

    with _loader("threads") as loader:
        bad = int(loader.indices(0)[2 * loader.batch_size + 5])  # in batch 2
    bad_pixels = golden.dataset("photos")[bad][0]

    def fail_there(pixels):
        if pixels.shape == bad_pixels.shape and np.array_equal(pixels, bad_pixels):
            raise ValueError("a transform that cannot apply")
        return pixels
    got = []
    with _loader(sample_transform=fail_there) as loader:
        with pytest.raises(SampleError, match=f"sample {bad}.*cannot apply") as caught:
            for batch in loader:
                got.append(batch)
    assert len(got) == 2 and caught.value.sample == bad
    skip = {"workers": {"on_error": "skip"}}
    with _loader(sample_transform=fail_there, **skip) as loader:
        ray_epoch, ray_skipped = golden.epochs(loader, 1), [s.sample for s in loader.skipped]
    with _loader("threads", sample_transform=fail_there, **skip) as loader:
        assert golden.epochs(loader, 1) == ray_epoch
        assert [s.sample for s in loader.skipped] == ray_skipped == [bad]


@in_forked_child
def test_resume_and_elastic_resume(ray_address):
    """A state saved by a loader with Ray actors is the pinned one; pinned states resume to
    the pinned rest of their epoch with Ray actors, saved by two ranks and read by one, and
    saved by one rank and read by two."""
    with _loader() as loader:
        for _ in loader:
            pass
        for k, _ in enumerate(loader):
            if k + 1 == golden.RESUME_AFTER:
                assert loader.state_dict() == PINNED["states"]["one-rank"]
                break
        loader.load_state_dict(PINNED["states"]["two-ranks"])
        assert [golden.digest(b) for b in loader] == PINNED["resumed"]["two-ranks-as-one"]
    assert golden.resumed(PINNED["states"]["one-rank"], "ray", rank=1, world_size=2) == \
        PINNED["resumed"]["one-rank-as-rank1-of-2"]


@in_forked_child
def test_a_cluster_without_cpus_for_the_actors_is_named(ray_address, tmp_path):
    """More actors than the cluster has CPUs: refused at once; CPUs held by another
    loader's actors: refused after the timeout, naming the address and the free CPUs; an
    actor that cannot set up (here: a sample_transform from a module only this process
    can import) names its node and the cause."""
    from dlpack_io.reader.batch.errors import WorkerError
    from dlpack_io.reader.batch.rayworkers import RayClusterError

    (tmp_path / "only_here.py").write_text("def same(pixels):\n    return pixels\n")
    sys.path.insert(0, str(tmp_path))
    import only_here

    with _loader(sample_transform=only_here.same) as loader:
        with pytest.raises(WorkerError, match=r"Ray loader actor \d could not set up on node "
                                              r"127.0.0.2 .*No module named 'only_here'"):
            next(iter(loader))

    with _loader(num_workers=5) as loader:
        with pytest.raises(RayClusterError, match=f"cluster at {ray_address} has 4 CPUs; 5 "
                                                  "loader actors of 1 CPU need 5"):
            next(iter(loader))
    with _loader(num_workers=3) as holder:
        held = iter(holder)  # kept: a closed epoch may hand its actors' CPUs back at once
        next(held)  # three actors started and holding their CPUs
        with _loader(workers={"timeout": 3}) as loader:
            with pytest.raises(RayClusterError, match=f"within 3 s on the Ray cluster at "
                                                      f"{ray_address} .*CPUs free.*no CPUs "
                                                      f"free for them"):
                next(iter(loader))
        held.close()


DRIVER = """
import json, sys
import golden
from dlpack_io.reader import Loader
case, root, actor_env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
set_name, kwargs = golden.cases()[case]
runtime_env = {"env_vars": actor_env}  # the actors' own credentials and cache folder
options = golden.options(kwargs, "ray", workers={"ray_options": {"runtime_env": runtime_env}})
with Loader(golden.dataset(set_name, root), **options) as loader:
    digests = golden.epochs(loader)
    stats = loader.stats().run
print(json.dumps({"digests": digests, "fetched": stats.fetched_bytes, "moved": stats.moved_bytes}))
"""


def test_an_s3_data_set_is_fetched_by_the_actors(ray_address, s3_env, tmp_path):
    """Each actor opens s3://... itself: the endpoint comes from this process, the
    credentials and cache folder from the actors' own environment (here a runtime_env);
    the batches are the pinned ones and the training process fetches no record."""
    root = "s3://dlpack-test/ray-golden"
    upload_folder(golden.DATA / "photos", f"{root}/photos", s3_env.env())
    actor_env = {k: v for k, v in s3_env.env().items() if k in (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    actor_env["DLPACK_CACHE_DIR"] = str(tmp_path / "actor-cache")
    out = subprocess.run([sys.executable, "-c", DRIVER, CASE, root, json.dumps(actor_env)],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["digests"] == PINNED["cases"][CASE]
    assert result["fetched"] == 0 and result["moved"] > 0
    assert any(files for _, _, files in os.walk(tmp_path / "actor-cache"))


@pytest.fixture
def extra_node(ray_cluster):
    """A third node of one CPU, started for this test (which kills it): its node manager
    port and its session (every process of the node is in it)."""
    return ray_cluster.add_node(cpus=1), ray_cluster.procs[-1].pid


@in_forked_child
def test_a_lost_node_costs_only_its_batches(ray_address, extra_node, tmp_path):
    """Three actors spread over three nodes; the third node dies (every process of it
    SIGKILLed) while its actor builds a batch: that actor's batches are built again by the
    actors on the other nodes, identical."""
    import ray

    port, session = extra_node
    ray.init(address=ray_address, log_to_driver=False, logging_level=logging.WARNING)
    node = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerPort"] == port)
    marker = tmp_path / "reached"

    def hang_there(pixels):  # on the doomed node, once: say so, then wait to be killed
        if ray.get_runtime_context().get_node_id() == node and not marker.exists():
            marker.write_text("")
            threading.Event().wait()
        return pixels

    def kill_node():
        while not marker.exists():  # the event: the actor on the node reached its batch
            threading.Event().wait(0.05)
        for pid in session_pids({session}):
            os.kill(pid, signal.SIGKILL)
    killer = threading.Thread(target=kill_node, daemon=True)
    killer.start()
    spread = {"scheduling_strategy": "SPREAD"}  # one actor on each node
    with _loader(num_workers=3, sample_transform=hang_there,
                 workers={"ray_options": spread}) as loader:
        got = golden.epochs(loader, 1)
        stats = loader.stats()
    killer.join(5)
    assert not killer.is_alive(), "no actor ran on the third node"
    assert stats.rebuilt >= 1
    with _loader("threads", sample_transform=hang_there) as loader:
        assert got == golden.epochs(loader, 1)
