"""dlpack convert --engine ray to an s3:// DST: the cluster's tasks upload the shards,
the driver keeps the journal in the bucket and writes the manifest last. A real two-node
Ray cluster and a real S3 server (SeaweedFS).

The nodes are started with credentials that the server refuses and no endpoint, so a run
works only when the driver sends the endpoint and the explicit ``storage_options`` to the
tasks, and a run that relies on the driver's own environment fails at once, naming a node.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
pytest.importorskip("ray")
pytest.importorskip("obstore")

from dlpack_io.packer import convert  # noqa: E402
from dlpack_io.packer.journal import JOURNAL_NAME  # noqa: E402
from dlpack_io.reader import format as fmt  # noqa: E402
from dlpack_io.reader.remote.storage import Store  # noqa: E402
from dlpack_io.tools.bench.seaweed import ACCESS_KEY, SECRET_KEY  # noqa: E402
from helpers import photo_folder  # noqa: E402
from raycluster import module_cluster  # noqa: E402

SHARD = "60KB"
BUCKET = "dlpack-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two one-CPU nodes whose own S3 credentials are wrong and who know no endpoint."""
    nowhere = str(tmp_path_factory.mktemp("no-aws") / "none")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="node-key", AWS_SECRET_ACCESS_KEY="not-the-secret",
               AWS_SHARED_CREDENTIALS_FILE=nowhere, AWS_CONFIG_FILE=nowhere)
    yield from module_cluster(nodes=2, cpus=1, env=env)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """240 photo-like JPEGs and one broken file: about 20 shards of 60 KB."""
    return photo_folder(tmp_path_factory.mktemp("ray_s3_src"), 240, 4, seed=5, size=(96, 128),
                        broken_in="class_02")


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("ray_s3_ref") / "ds"
    convert(source, dst, shard_size=SHARD, workers=1, progress=False)
    return dst


def _bucket_objects(url) -> dict:
    store = Store(url)
    return {name: store.get(name) for name in store.list()}


def _without_volatile(manifest_bytes) -> dict:
    manifest = json.loads(manifest_bytes)
    for key in fmt.VOLATILE_MANIFEST_KEYS:
        manifest.pop(key)
    return manifest


def _journaled(store) -> list:
    """(name, end_input) of the shards in the bucket's journal, in order."""
    if store.head(JOURNAL_NAME) is None:
        return []
    lines = store.get(JOURNAL_NAME).decode().splitlines()[1:]
    return [(e["shard"]["name"], e["end_input"]) for e in map(json.loads, lines)]


def test_nodes_that_cannot_write_fail_fast_naming_the_node_and_leave_the_bucket_alone(
        cluster, s3_env, source):
    url = f"s3://{BUCKET}/ray/refused"
    cmd = [sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(source), url,
           "--shard-size", SHARD, "--quiet", "--engine", "ray", "--ray-address", cluster.address]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"the Ray node at 127.0.0.2 cannot write to {url}" in done.stderr
    assert "credentials are not sent over the cluster" in done.stderr
    assert "not-the-secret" not in done.stderr and SECRET_KEY not in done.stderr
    assert Store(url).list() == {}  # no journal, no shard, no probe object


# The driver runs as a process of its own, as a user's would: Ray drivers in the suite's
# process leave state behind (see helpers.in_forked_child), and a forked child cannot be
# used here because this process has S3 clients whose runtime threads a fork does not copy.
DRIVER = """
import json, sys
from dlpack_io.packer import convert
result = convert(sys.argv[1], sys.argv[2], shard_size=sys.argv[3], progress=False,
                 engine="ray", ray_address=sys.argv[4], resume=sys.argv[7] == "resume",
                 storage_options={"access_key_id": sys.argv[5],
                                  "secret_access_key": sys.argv[6]})
print(json.dumps({k: result[k] for k in ("engine", "rejects", "resumed_from")}))
"""


def test_driver_killed_then_resume_uploads_the_local_bytes(cluster, s3_env, source, reference):
    url = f"s3://{BUCKET}/ray/resumed"
    store = Store(url)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    driver = [sys.executable, "-c", DRIVER, str(source), url, SHARD, cluster.address,
              ACCESS_KEY, SECRET_KEY]
    proc = subprocess.Popen([*driver, "new"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while len(kept := _journaled(store)) < 3:  # the event: three shards journaled
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no three journaled shards within 180 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert store.head(fmt.MANIFEST_NAME) is None, "the kill came too late to test anything"
    kept = _journaled(store)  # what the killed run finished (maybe more than three by now)
    # what a probe PUT landing after its own DELETE (seen on a loaded server) leaves behind
    store.put(".dlpack-probe-othernode-4242", b"dlpack: can this node write here?")

    done = subprocess.run([*driver, "resume"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["engine"] == "ray" and result["rejects"] == 1
    assert result["resumed_from"] == kept[-1][1] > 0  # the kept shards were not redone
    objects = _bucket_objects(url)
    local = sorted(set(os.listdir(reference)) - {"inputstat.json"})  # none after a resume
    assert sorted(objects) == local  # no journal, probe (however it came), temp object
    for name in local:
        data = (reference / name).read_bytes()
        if name == fmt.MANIFEST_NAME:
            ours = json.loads(objects[name])
            assert ours["created"]["engine"] == "ray"
            assert _without_volatile(objects[name]) == _without_volatile(data)
        else:
            assert objects[name] == data, name
