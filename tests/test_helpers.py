"""The test helpers that decide outcomes must report failures (in_forked_child), and the local
Ray cluster retries only what Ray itself gave up on."""
import os

import pytest

from helpers import in_forked_child


def test_a_child_test_that_passes_passes(tmp_path):
    @in_forked_child
    def child_test(path):
        (path / "ran").write_text(str(os.getpid()))

    child_test(tmp_path)
    assert int((tmp_path / "ran").read_text()) != os.getpid()  # it ran, in another process


def test_a_failing_child_test_fails_with_its_traceback():
    @in_forked_child
    def child_test():
        assert 1 + 1 == 3, "arithmetic broke"

    with pytest.raises(pytest.fail.Exception, match=r"(?s)Traceback.*arithmetic broke"):
        child_test()


def test_a_skipped_child_test_is_skipped():
    @in_forked_child
    def child_test():
        pytest.skip("no tmpfs here")

    with pytest.raises(pytest.skip.Exception, match="no tmpfs here"):
        child_test()


def test_a_child_that_dies_without_reporting_fails_naming_its_exit_code():
    @in_forked_child
    def child_test():
        os._exit(7)

    with pytest.raises(pytest.fail.Exception, match=r"child_test's process died \(exit code 7\)"):
        child_test()


def test_fixtures_still_reach_a_wrapped_test(request):
    @in_forked_child
    def child_test(tmp_path, data_format):
        pass

    assert child_test.__wrapped__.__name__ == "child_test"
    import inspect

    assert list(inspect.signature(child_test).parameters) == ["tmp_path", "data_format"]


def test_a_ray_node_that_ray_gives_up_on_is_started_once_more_afresh(monkeypatch):
    pytest.importorskip("ray")
    from raycluster import LocalRayCluster, RayGaveUp

    real, roots = LocalRayCluster._start_node, []

    def gives_up_once(self, args, log, deadline):
        roots.append(str(self.root))
        if len(roots) == 1:
            raise RayGaveUp("ray node did not start: ... timed out during startup")
        return real(self, args, log, deadline)
    monkeypatch.setattr(LocalRayCluster, "_start_node", gives_up_once)
    cluster = LocalRayCluster(nodes=1).start()
    try:
        assert len(roots) == 2 and roots[0] != roots[1] and not os.path.exists(roots[0])
        assert cluster.env["RAY_TMPDIR"] == roots[1] and len(cluster.procs) == 1
    finally:
        cluster.stop()

    def fails(self, args, log, deadline):
        roots.append(str(self.root))
        raise RuntimeError("ray node did not start: exited 1")
    monkeypatch.setattr(LocalRayCluster, "_start_node", fails)
    with pytest.raises(RuntimeError, match="exited 1"):
        LocalRayCluster(nodes=1).start()
    assert len(roots) == 3  # any other failure: no second try
