"""The resume journal and the DST lock (packer/journal.py) on their own.

The end-to-end resume behaviour is in test_resume_options.py and test_convert.py; here:
the lock names the process holding it (not a stale pid left in the file), refuses what was
planted in its place, keeps or removes its file as asked; the journal reader ignores what
is not a journal of ours and a torn last line; a refused plan names an option that only
one of the two runs had.
"""
import json
import os

import pytest

from dlpack_io.packer import journal
from dlpack_io.packer.scan import Inputs


def test_lock_names_its_holder_not_a_stale_pid(tmp_path):
    lock_file = tmp_path / journal.LOCK_NAME
    lock_file.write_text("123456789012\n")  # a crashed run's longer pid
    first = journal.DstLock(tmp_path)
    first.acquire()
    assert lock_file.read_text() == str(os.getpid())
    with pytest.raises(RuntimeError, match=rf"^{tmp_path} is being written by another dlpack "
                                           rf"convert \(pid {os.getpid()}\); wait for it"):
        journal.DstLock(tmp_path).acquire()  # another open file: flock refuses it too
    first.release()  # an interrupted run leaves the file; the lock itself is free
    assert lock_file.exists()
    second = journal.DstLock(tmp_path)
    second.acquire()
    second.release(remove=True)  # the conversion is complete: the file goes
    assert not lock_file.exists()
    second.release(remove=True)  # a second release does nothing


def test_lock_refuses_what_was_planted_in_its_place(tmp_path):
    (tmp_path / "victim").write_text("precious")
    (tmp_path / journal.LOCK_NAME).symlink_to(tmp_path / "victim")
    with pytest.raises(RuntimeError, match=rf"^{tmp_path / journal.LOCK_NAME} is a symbolic "
                                           rf"link; dlpack never writes through links"):
        journal.DstLock(tmp_path).acquire()
    os.unlink(tmp_path / journal.LOCK_NAME)
    os.mkfifo(tmp_path / journal.LOCK_NAME)
    with pytest.raises(RuntimeError, match=rf"^{tmp_path / journal.LOCK_NAME} is not a regular "
                                           rf"file; remove it"):
        journal.DstLock(tmp_path).acquire()
    os.unlink(tmp_path / journal.LOCK_NAME)
    os.mkdir(tmp_path / journal.LOCK_NAME)  # any other error is raised as it is
    with pytest.raises(IsADirectoryError, match=journal.LOCK_NAME):
        journal.DstLock(tmp_path).acquire()
    assert (tmp_path / "victim").read_text() == "precious"


@pytest.mark.parametrize("text", ["", "\n", '{"plan": "ab', '{"shard": {"name": "x"}}\n',
                                  "[1, 2]\n"], ids=["empty", "blank", "torn-plan", "no-plan",
                                                    "not-an-object"])
def test_what_is_not_a_journal_is_no_plan(tmp_path, text):
    assert journal.read_journal(tmp_path) == (None, [])  # no file
    (tmp_path / journal.JOURNAL_NAME).write_text(text)
    assert journal.read_journal(tmp_path) == (None, [])


def test_torn_last_line_is_ignored(tmp_path):
    plan, shards = {"plan": "p", "num_inputs": 3}, [{"shard": {"name": f"s{i}"}} for i in range(2)]
    j = journal.Journal(tmp_path, plan)
    for entry in shards:
        j.append(entry)
    with open(tmp_path / journal.JOURNAL_NAME, "a") as f:
        f.write('{"shard": {"na')  # killed mid-append
    assert journal.read_journal(tmp_path) == (plan, shards)
    lines = (tmp_path / journal.JOURNAL_NAME).read_text().split("\n")
    assert [json.loads(line) for line in lines[:3]] == \
        [dict(e, crc32=journal.line_crc(e)) for e in [plan] + shards]  # each line sealed


def test_an_option_only_one_run_had_is_named(tmp_path):
    """A journal from a version with fewer options: the new option is named, either way."""
    inputs = Inputs(root=str(tmp_path), paths=["a/1.jpg", "b/2.jpg"], labels=[0, 1],
                    classes=["a", "b"])
    stats = [(10, 1), (20, 2)]
    old = journal.plan_line(inputs, stats, {"mode": "raw"}, 2)
    new = journal.plan_line(inputs, stats, {"mode": "raw", "quality": 90}, 2)
    assert journal.plan_differences(old, new) == ["quality: None then, 90 now"]
    assert journal.plan_differences(new, old) == ["quality: 90 then, None now"]
    assert journal.plan_differences(old, dict(old)) == []
