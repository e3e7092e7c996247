"""The golden batches (tests/golden.py): every case, with serial, thread and process workers,
gives exactly the batches pinned in tests/data/golden/digests.json, and saved loader states
resume to exactly the pinned rest of their epoch; a few cases also with Ray actors on a real
local cluster (the ``ray_address`` fixture, tests/batch/conftest.py)."""
from __future__ import annotations

import pytest

import golden
from helpers import in_forked_child

PINNED = golden.load()


@pytest.fixture(autouse=True)
def _torch_reference_kernels(monkeypatch):
    """The device-transform cases run the kernels' torch reference on the CPU (Triton's
    interpreter rounds some float steps differently; the kernel tests cover it)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_every_case_is_pinned():
    assert set(PINNED["cases"]) == set(golden.cases())
    assert all(len(epochs) == golden.EPOCHS and all(epochs) for epochs in
               PINNED["cases"].values())


@pytest.mark.parametrize("workers", sorted(golden.WORKERS))
@pytest.mark.parametrize("case", sorted(golden.cases()))
def test_batches_are_the_pinned_ones(case, workers):
    assert golden.run_case(case, workers) == PINNED["cases"][case]


@pytest.mark.parametrize("case", golden.RAY_CASES)
@in_forked_child  # one Ray driver session per process (tests/helpers.py)
def test_ray_batches_are_the_pinned_ones(ray_address, case):
    """Batches built by Ray actors, returned through Ray's object store, are the pinned
    ones (the actors import tests/golden.py's sample_transform: pickled by value here)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(golden)
    assert golden.run_case(case, "ray") == PINNED["cases"][case]


def test_epochs_and_seeds_differ():
    """The digests can tell batches apart: two epochs of a shuffled case differ, and so do
    two seeds (a digest blind to the pixels would pass everything above)."""
    epochs = PINNED["cases"]["rrc-flip-normalize"]
    assert epochs[0] != epochs[1]
    assert golden.run_case("rrc-flip-normalize", seed=4)[0] != epochs[0]


def test_state_dicts_are_unchanged():
    """A state saved now is the one pinned (saved by the code the digests came from)."""
    assert golden.resume_states() == PINNED["states"]


@pytest.mark.parametrize("name,state,change", [
    ("one-rank", "one-rank", {}),
    ("one-rank-as-rank1-of-2", "one-rank", {"rank": 1, "world_size": 2}),
    ("two-ranks-as-one", "two-ranks", {}),
])
def test_saved_states_resume_to_the_pinned_batches(name, state, change):
    got = golden.resumed(PINNED["states"][state], **change)
    assert got == PINNED["resumed"][name]


@pytest.mark.parametrize("case,legacy", [
    ("rrc-uint8-targets", dict(return_index=True, worker_kind="process")),
    ("pad-detection", dict(pad=True, pad_multiple=8, prefetch=3, on_error="raise")),
    ("block-drop-last-rank1", dict(block_size=4, block_window=2, log_every=100)),
    ("subset-indices", dict(indices=list(range(3, 35, 2)), reduced_decode=True)),
])
def test_keywords_of_earlier_releases_give_the_same_batches(case, legacy):
    """Scripts written for the flat keywords keep their batches, with a DeprecationWarning
    naming the new spelling for each."""
    from dlpack_io.reader import Loader

    set_name, kwargs = golden.cases()[case]
    kwargs = {k: v for k, v in kwargs.items() if k not in ("order", "workers", "output")}
    with pytest.warns(DeprecationWarning) as caught:
        loader = Loader(golden.dataset(set_name), **kwargs, num_workers=2, **legacy)
    named = {str(w.message).split("(")[1].split("=")[0] for w in caught}
    assert named == set(legacy)
    with loader:
        assert golden.epochs(loader) == PINNED["cases"][case]


def test_resume_continues_the_uninterrupted_epoch():
    full = PINNED["cases"][golden.RESUME_CASE][1]
    assert PINNED["resumed"]["one-rank"] == full[golden.RESUME_AFTER:]
