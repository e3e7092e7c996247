"""The test helpers that decide outcomes must report failures: in_forked_child."""
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
