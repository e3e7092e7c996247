"""dlpack convert --engine ray on a real two-node Ray cluster started by the tests:
byte-identical to the local engine, rejects as local, faults (worker killed mid-task,
driver SIGKILLed then --resume), the DST rules. One cluster serves the whole module."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

# Ray reads its auth mode when it is imported; `ray start` clusters of Ray 2.60 have token
# authentication off, and so do the tests' clusters (tests/raycluster.py).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
pytest.importorskip("ray")

from raycluster import module_cluster, session_pids  # noqa: E402

from dlpack_io.packer import convert  # noqa: E402
from dlpack_io.packer.journal import JOURNAL_NAME, DstLock  # noqa: E402
from dlpack_io.packer.records import ConversionError  # noqa: E402

from helpers import dataset_fingerprint, in_forked_child, photo_folder  # noqa: E402

SHARD = "60KB"


@pytest.fixture(scope="module")
def cluster():
    """A head node and a second node, one CPU each, as separate `ray start` processes."""
    yield from module_cluster(nodes=2, cpus=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """360 photo-like JPEGs (96x128, so a task takes a while) and one broken file."""
    return photo_folder(tmp_path_factory.mktemp("ray_src"), 360, 4, seed=3, size=(96, 128),
                        broken_in="class_01")


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    """The local engine's output for each format."""
    out = {}
    for data_format in ("record", "lmdb"):
        dst = tmp_path_factory.mktemp("ray_ref") / data_format
        convert(source, dst, format=data_format, shard_size=SHARD, workers=1, progress=False)
        out[data_format] = dst
    return out


def _sha256s(dst) -> dict:
    return {n: hashlib.sha256((dst / n).read_bytes()).hexdigest()
            for n in os.listdir(dst) if n.startswith("shard-")}


def _manifest(dst) -> dict:
    return json.loads((dst / "manifest.json").read_text())


def _cli(cluster, src, dst, *extra):
    return [sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(src), str(dst),
            "--shard-size", SHARD, "--quiet", "--engine", "ray", "--ray-address",
            cluster.address, "--max-rejects", "1", *extra]  # the source's one broken file


def _assert_finished_cleanly(dst, resumed: bool = False):
    """Shards, manifest, rejects and (not after a resume, which cannot know the times of
    the files its killed run read: packer/appendbase.py) the input-stat record; nothing else."""
    names = set(os.listdir(dst))
    assert {n for n in names if not n.startswith("shard-")} == \
        {"manifest.json", "rejects.tsv"} | (set() if resumed else {"inputstat.json"})


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
@in_forked_child
def test_two_node_cluster_is_byte_identical_to_local(cluster, source, reference, tmp_path,
                                                     data_format, caplog):
    caplog.set_level("INFO", logger="dlpack_io.packer.engines")
    dst = tmp_path / "ds"
    result = convert(source, dst, format=data_format, shard_size=SHARD, progress=False,
                     engine="ray", ray_address=cluster.address)
    assert "2 nodes, 2 CPUs used" in caplog.text
    ref = reference[data_format]
    assert result["num_shards"] > 10 and result["rejects"] == 1
    assert _sha256s(dst) == _sha256s(ref)
    ours, theirs = _manifest(dst), _manifest(ref)
    assert ours["created"]["engine"] == "ray" and theirs["created"]["engine"] == "local"
    for m in (ours, theirs):
        del m["created"], m["checksum"]
    assert ours == theirs
    assert (dst / "rejects.tsv").read_bytes() == (ref / "rejects.tsv").read_bytes()
    _assert_finished_cleanly(dst)


@in_forked_child
def test_odd_inputs_are_rejected_and_reencoded_as_local(cluster, odd_folder, tmp_path):
    root, files = odd_folder
    local = convert(root, tmp_path / "local", workers=0, progress=False)
    ray = convert(root, tmp_path / "ray", progress=False, engine="ray", ray_address=cluster.address)
    facts = ("rejects", "reencoded", "lossless")
    assert [ray[k] for k in facts] == [local[k] for k in facts]
    # odd JPEGs keep their bytes (the reader turns and converts them); a PNG named .jpg is
    # stored losslessly (its own file, or raw pixels); nothing is re-encoded lossily
    assert ray["rejects"] == 3 and ray["reencoded"] == {}
    assert ray["lossless"].get("PNG image stored as raw pixels", 0) <= 1
    reasons = {r["path"]: r["reason"] for r in _manifest(tmp_path / "ray")["rejects"]}
    assert reasons[files["zero_bytes"]] == "empty file (0 bytes)"
    assert dataset_fingerprint(tmp_path / "ray") == dataset_fingerprint(tmp_path / "local")


@in_forked_child
def test_on_error_fail_stops_with_the_local_message(cluster, odd_folder, tmp_path):
    root, _ = odd_folder
    messages = []
    for engine, address in (("local", None), ("ray", cluster.address)):
        with pytest.raises(ConversionError, match=r"--on-error fail stops at the first bad "
                                                  r"input") as info:
            convert(root, tmp_path / engine, on_error="fail", shuffle=False, progress=False,
                    engine=engine, ray_address=address)
        messages.append(str(info.value).replace(str(tmp_path / engine), "DST"))
        assert not (tmp_path / engine).exists()  # no shard completed: nothing left behind
    assert messages[0] == messages[1] and "c/not_an_image.JPG" in messages[0]


@in_forked_child
def test_a_stopped_conversion_lets_its_tasks_finish_instead_of_cancelling(
        cluster, source, reference, tmp_path):
    """ray.cancel racing with a task that is just finishing aborts the driver inside Ray
    (ray-project/ray#54846, seen once in the load series): a conversion stopped by
    --on-error fail or by Ctrl-C waits for the tasks it submitted and cancels none, nothing
    of it runs once convert() has returned, and --resume finishes byte-identical."""
    import ray

    from dlpack_io.packer import engines

    cancelled, submitted = [], []
    ray.cancel = lambda ref, **kwargs: cancelled.append(ref)  # this forked child's Ray only
    # the caller's own connection: its tasks would outlive convert() if it left them running
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    kwargs = dict(shard_size=SHARD, progress=False, engine="ray")
    # unshuffled, class_01/broken.jpg comes early: encode segments are still queued behind it
    with pytest.raises(ConversionError, match="--on-error fail stops at the first bad input"):
        convert(source, tmp_path / "fail", on_error="fail", shuffle=False, **kwargs)

    poll = engines.RayPlanner.poll

    def poll_then_ctrl_c(planner):
        poll(planner)
        if planner.state.shards and planner.pending:  # a shard journaled, more being written
            submitted.extend(p[0] for p in planner.pending)
            raise KeyboardInterrupt

    engines.RayPlanner.poll = poll_then_ctrl_c
    dst = tmp_path / "ctrl-c"
    with pytest.raises(KeyboardInterrupt):
        convert(source, dst, **kwargs)
    engines.RayPlanner.poll = poll
    assert submitted and cancelled == []
    _, running = ray.wait(submitted, num_returns=len(submitted), timeout=0, fetch_local=False)
    assert running == []
    assert not [n for n in os.listdir(dst) if n.endswith(".partial")]
    assert 0 < len(_journaled(dst)) < len([n for n in os.listdir(dst) if n.startswith("shard-")])
    result = convert(source, dst, resume=True, **kwargs)
    assert result["resumed_from"] > 0
    assert _sha256s(dst) == _sha256s(reference["record"])


@in_forked_child
def test_dst_rules_are_the_local_ones(cluster, source, tmp_path):
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match="not empty"):
        convert(source, dst, progress=False, engine="ray", ray_address=cluster.address)
    lock = DstLock(str(dst))
    lock.acquire()
    try:
        with pytest.raises(RuntimeError, match="another dlpack convert"):
            convert(source, dst, overwrite=True, progress=False, engine="ray",
                    ray_address=cluster.address)
    finally:
        lock.release()
    assert sorted(os.listdir(dst)) == [".dlpack-convert.lock", "notes.txt"]


def _journaled(dst) -> list:
    try:
        lines = (dst / JOURNAL_NAME).read_text().splitlines()
    except FileNotFoundError:
        return []
    done = []
    for line in lines[1:]:
        try:
            done.append(json.loads(line)["shard"]["name"])
        except json.JSONDecodeError:  # a line being appended right now
            break
    return done


def _wait_for(predicate, proc, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert proc.poll() is None, f"the conversion ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.002)
    return found


def test_driver_sigkill_then_resume_is_identical_and_keeps_finished_shards(
        cluster, source, reference, tmp_path):
    dst = tmp_path / "ds"
    proc = subprocess.Popen(_cli(cluster, source, dst), env=cluster.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kept = _wait_for(lambda: _journaled(dst)[:3] if len(_journaled(dst)) >= 3 else None,
                     proc, "three journaled shards")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (dst / "manifest.json").exists(), "the kill came too late to test anything"
    before = {n: (dst / n).stat() for n in kept}
    done = subprocess.run(_cli(cluster, source, dst, "--resume"), env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed at input" in done.stdout
    assert dataset_fingerprint(dst) == dataset_fingerprint(reference["record"])
    for name, st in before.items():  # finished shards were kept, not written again
        now = (dst / name).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), name
    _assert_finished_cleanly(dst, resumed=True)


def _cluster_procs(cluster) -> dict:
    """pid -> command line of every process of the cluster (Ray names a busy worker
    after its task: ``ray::encode_segment``)."""
    procs = {}
    for pid in session_pids(cluster.sessions()):
        try:
            procs[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return procs


def _freeze_worker_running(cluster, task: str):
    """A worker caught inside ``task``, stopped (SIGSTOP) so it cannot finish; its pid."""
    for pid, cmd in _cluster_procs(cluster).items():
        if cmd.startswith(f"ray::{task}"):
            os.kill(pid, signal.SIGSTOP)
            if _cluster_procs(cluster).get(pid, "").startswith(f"ray::{task}"):
                return pid  # still inside the task while frozen: a mid-task kill
            os.kill(pid, signal.SIGCONT)
    return None


@pytest.mark.parametrize("task", ["encode_segment", "assemble_shard"])
def test_worker_killed_mid_task_is_retried_and_output_identical(cluster, source, reference,
                                                                tmp_path, task):
    dst = tmp_path / "ds"
    proc = subprocess.Popen(_cli(cluster, source, dst), env=cluster.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    victim = _wait_for(lambda: _freeze_worker_running(cluster, task), proc, f"a {task} task")
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert not os.path.exists(f"/proc/{victim}")
    assert dataset_fingerprint(dst) == dataset_fingerprint(reference["record"])
    _assert_finished_cleanly(dst)


def test_resume_with_the_other_engine_is_identical(cluster, source, reference, tmp_path):
    """The journal does not depend on the engine: a Ray run killed mid-way is finished by
    the local engine (and would be the other way round) with the same bytes."""
    dst = tmp_path / "ds"
    proc = subprocess.Popen(_cli(cluster, source, dst), env=cluster.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for(lambda: len(_journaled(dst)) >= 2, proc, "two journaled shards")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    result = convert(source, dst, resume=True, shard_size=SHARD, workers=1, progress=False)
    assert result["resumed_from"] > 0 and result["engine"] == "local"
    assert dataset_fingerprint(dst) == dataset_fingerprint(reference["record"])


def _in_loopback_namespace(cmd: list) -> list:
    """``cmd`` in a new network namespace whose only interface is loopback (needs root):
    a cluster that Ray starts by itself then cannot listen on, or talk to, anything else."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]


@pytest.mark.slow
def test_private_cluster_when_no_address_is_given(source, reference, tmp_path):
    """Without --ray-address the driver starts a Ray instance of its own (--workers CPUs)
    and stops it when done."""
    probe = subprocess.run(_in_loopback_namespace(["true"]), capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.decode().strip()}")
    ray_tmp = tempfile.mkdtemp(prefix="dlpriv")  # short: Ray's socket paths must fit
    env = dict(os.environ, HOME=str(tmp_path), RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    dst = tmp_path / "ds"
    cmd = [sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(source), str(dst),
           "--shard-size", SHARD, "--quiet", "--engine", "ray", "--workers", "2",
           "--max-rejects", "1"]
    try:
        done = subprocess.run(_in_loopback_namespace(cmd), env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        survivors = subprocess.run(["pgrep", "-f", ray_tmp], capture_output=True, text=True).stdout
        used = [n for n in os.listdir(ray_tmp) if n.startswith("ray")]
        shutil.rmtree(ray_tmp, ignore_errors=True)
    # the private cluster ran under ray_tmp (its processes name that folder on their command
    # lines): finding none of them afterwards is then evidence, not an empty search
    assert used, f"Ray never used {ray_tmp}: the search for survivors would prove nothing"
    assert survivors == "", "the private cluster outlived its driver"
    assert done.returncode == 0, done.stderr
    assert dataset_fingerprint(dst) == dataset_fingerprint(reference["record"])
    assert _manifest(dst)["created"]["engine"] == "ray"


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@in_forked_child
def test_disk_full_in_a_shard_task_then_resume_is_identical(cluster, source, reference,
                                                            small_tmpfs):
    """A shard task meets a full disk: the local engine's message, no temp file left,
    the shards written before it kept; --resume with room finishes byte-identical."""
    dst = small_tmpfs / "ds"
    kwargs = dict(shard_size=SHARD, progress=False, engine="ray", ray_address=cluster.address)
    with pytest.raises(ConversionError, match=r"cannot write shard \d+ \(OSError: .*No space left.*--resume"):
        convert(source, dst, **kwargs)
    assert not [n for n in os.listdir(dst) if n.endswith(".partial")]
    assert not (dst / "manifest.json").exists() and len(_journaled(dst)) > 0
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=True)
    result = convert(source, dst, resume=True, **kwargs)
    assert result["resumed_from"] > 0
    assert dataset_fingerprint(dst) == dataset_fingerprint(reference["record"])


@in_forked_child
def test_unreachable_address_fails_fast_and_touches_nothing(image_folder, tmp_path):
    from raycluster import HOST, free_ports

    address = f"{HOST}:{free_ports(1)[0]}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ConversionError, match=f"cannot reach the Ray cluster at {address}"):
        convert(image_folder, tmp_path / "ds", engine="ray", ray_address=address, progress=False)
    assert time.monotonic() - start < 300  # a hang guard: connection refused ends it at once
    assert not (tmp_path / "ds").exists()
    with pytest.raises(ConversionError, match="expected HOST:PORT"):
        convert(image_folder, tmp_path / "ds", engine="ray", ray_address="headnode",
                progress=False)


@in_forked_child
def test_a_task_that_keeps_dying_is_a_clear_error(cluster):
    """What the driver says when Ray gives up on a task whose worker dies every time."""
    import ray

    from dlpack_io.packer.engines import task_result

    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        ref = ray.remote(max_retries=1)(lambda: os._exit(1)).remote()
        with pytest.raises(ConversionError, match=r"encoding a\.jpg \.\. b\.jpg: Ray gave up "
                                                  r"after 3 retries \(\w+Error.*--resume"):
            task_result(ray, ref, "encoding a.jpg .. b.jpg")
    finally:
        ray.shutdown()



@in_forked_child
def test_conversions_use_the_callers_own_connection_and_leave_it_open(cluster, source,
                                                                      reference, tmp_path):
    """Several conversions from one Python process: connect once with ray.init, and each
    convert(engine="ray") runs on that connection and leaves it open (Ray does not support
    ray.init again after ray.shutdown in one process: docs/scale.md)."""
    import ray

    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        node = ray.get_runtime_context().get_node_id()
        for name in ("first", "second"):
            convert(source, tmp_path / name, shard_size=SHARD, progress=False, engine="ray")
            assert ray.is_initialized() and ray.get_runtime_context().get_node_id() == node
            assert dataset_fingerprint(tmp_path / name) == dataset_fingerprint(
                reference["record"])
        with pytest.raises(ConversionError, match=r"already connected to a Ray cluster; "
                                                  r"leave out --ray-address"):
            convert(source, tmp_path / "third", progress=False, engine="ray",
                    ray_address=cluster.address)
        assert ray.is_initialized() and not (tmp_path / "third").exists()
    finally:
        ray.shutdown()

def _sigsegv_handler() -> int:
    """Address of the process's SIGSEGV handler (0: the default, death without a word)."""
    import ctypes

    class Sigaction(ctypes.Structure):
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                    ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]
    action = Sigaction()
    assert ctypes.CDLL(None).sigaction(signal.SIGSEGV, None, ctypes.byref(action)) == 0
    return action.handler or 0


@in_forked_child
def test_the_callers_faulthandler_survives_a_ray_conversion(cluster, source, tmp_path):
    """ray.init replaces the SIGSEGV handler and ray.shutdown leaves the default: a caller
    whose faulthandler was on gets it back (was: a later crash killed it without a word)."""
    import faulthandler

    faulthandler.enable()
    armed = _sigsegv_handler()
    assert armed != 0
    convert(source, tmp_path / "ds", shard_size=SHARD, progress=False, engine="ray",
            ray_address=cluster.address)
    assert _sigsegv_handler() == armed
