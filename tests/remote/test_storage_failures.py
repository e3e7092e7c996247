"""Honest failure words (issue 30): an endpoint that cannot be reached, refused credentials
and a missing bucket are each reported as that, naming the URL and what to check, by
Dataset, convert, inspect and verify (exit 4, never 1 "damaged"), against real servers:
a closed port, SeaweedFS and Azurite with a wrong key, a bucket that does not exist."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from emulators import AZURITE_ACCOUNT

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote.storage import (BucketNotFoundError, CredentialsError,
                                             EndpointUnreachableError)
from dlpack_io.tools.bench.seaweed import free_ports
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

SERVERS = {"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}
WRONG_KEY = "d3Jvbmcta2V5LW5vdC10aGUtZGV2ZWxvcG1lbnQtb25l"  # base64, not Azurite's key
EXPECTED = {  # failure -> (error class, words of the first line, words of the advice)
    "unreachable": (EndpointUnreachableError, "endpoint unreachable after",
                    "Check that the endpoint is reachable"),
    "credentials": (CredentialsError, "credentials refused", "Check the credentials"),
    "no-bucket": (BucketNotFoundError, "does not exist", "name: it does not exist"),
}


def _setup(scheme, failure, server, closed_port):
    """(URL, environment) that produce ``failure`` on ``scheme``'s real server."""
    env = server.env()
    bucket = "no-such-bucket" if failure == "no-bucket" else "dlpack-test"
    if failure == "unreachable":
        dead = f"http://127.0.0.1:{closed_port}"
        if scheme == "s3":
            env = {**env, "AWS_ENDPOINT_URL": dead}
        elif scheme == "gs":
            env = {"STORAGE_EMULATOR_HOST": dead}
        else:
            env = {"AZURE_STORAGE_CONNECTION_STRING": env["AZURE_STORAGE_CONNECTION_STRING"]
                   .replace(server.endpoint, f"{dead}/{AZURITE_ACCOUNT}")}
    elif failure == "credentials":
        env = server.env(key=WRONG_KEY) if scheme == "az" else \
            {**env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    return f"{scheme}://{bucket}/some/prefix", env


@pytest.fixture(scope="module")
def closed_port():
    """A port nobody listens on (picked free, never opened)."""
    return free_ports(1)[0]


@pytest.fixture(scope="module")
def three_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("three")
    make_image_folder(root, 3, 1, seed=2, size=(32, 32))
    return root


# fake-gcs-server takes any credentials, so "refused credentials" runs on S3 and Azure
CASES = [(s, f) for s in SERVERS for f in EXPECTED if not (s == "gs" and f == "credentials")]


@pytest.mark.parametrize("scheme,failure", CASES)
def test_each_failure_is_named_as_what_it_is(scheme, failure, request, cloud_env, closed_port,
                                             three_images):
    server = request.getfixturevalue(SERVERS[scheme])
    url, env = _setup(scheme, failure, server, closed_port)
    cloud_env(env)
    cls, first, advice = EXPECTED[failure]
    with pytest.raises(cls) as caught:
        Dataset(url, storage_options={"retries": 1})
    message = str(caught.value)
    assert f"{scheme}://{url.split('://')[1]}" in message and first in message, message
    assert advice in message and "damaged" not in message.lower()
    if failure == "unreachable":
        assert f"127.0.0.1:{closed_port}" in message  # the endpoint that did not answer
    report = verify(url, progress=False)
    assert report.exit_code == 4 and all(p["kind"] == "storage" for p in report.problems)
    assert first in report.problems[0]["problem"]
    with pytest.raises(ConversionError, match=first) as caught:
        convert(three_images, url, workers=1, progress=False, storage_options={"retries": 1})
    assert str(caught.value).endswith("nothing was uploaded: fix that and run the same "
                                      "command again")  # --resume would not help


def test_the_cli_says_it_and_verify_exits_4(s3_server, cloud_env):
    cloud_env(s3_server.env())
    url = "s3://no-such-bucket/data"
    result = CliRunner().invoke(main, ["verify", "--quiet", url])
    assert result.exit_code == 4, result.output
    assert "bucket or container does not exist" in result.output
    assert "STORAGE UNREADABLE" in result.output and "DAMAGED" not in result.output
    result = CliRunner().invoke(main, ["inspect", url])
    assert result.exit_code == 1 and "s3://no-such-bucket/data/" in result.output
    assert "bucket or container does not exist" in result.output


def test_a_missing_manifest_in_an_existing_bucket_is_still_not_a_data_set(s3_server, cloud_env):
    cloud_env(s3_server.env())
    report = verify("s3://dlpack-test/nothing-here", progress=False)
    assert report.exit_code == 3 and report.not_a_dataset
    with pytest.raises(FileNotFoundError, match="is not a dlpack data set"):
        Dataset("s3://dlpack-test/nothing-here")


def test_settings_the_client_refuses_are_named_at_once_without_retries(cloud_env):
    from dlpack_io.reader.remote.storage import StorageError

    with pytest.raises(StorageError, match=r"az://dlpack-test/x: cannot set up the Azure Blob "
                                           r"Storage client: .*Account must be specified.*"
                                           r"AZURE_STORAGE_ACCOUNT_NAME") as caught:
        Dataset("az://dlpack-test/x")  # no account anywhere
    assert "attempts" not in str(caught.value)
    report = verify("az://dlpack-test/x", progress=False)
    assert report.exit_code == 4 and "cannot set up" in report.problems[0]["problem"]


@pytest.fixture(scope="module")
def web_server(tmp_path_factory):
    """A plain web server (Python's http.server: HTML pages, 404 for everything we ask):
    what a wrong port or host answers with."""
    import http.server
    import threading

    root = tmp_path_factory.mktemp("www")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_an_endpoint_that_is_a_web_server_is_named_as_that(scheme, web_server, cloud_env,
                                                           three_images):
    """A web page where the service answers: not "bucket does not exist", not damage."""
    from dlpack_io.reader.remote.storage import WrongEndpointError

    env = {"s3": {"AWS_ENDPOINT_URL": web_server, "AWS_ACCESS_KEY_ID": "k",
                  "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"},
           "gs": {"STORAGE_EMULATOR_HOST": web_server},
           "az": {"AZURE_STORAGE_CONNECTION_STRING":
                  f"AccountName={AZURITE_ACCOUNT};AccountKey={WRONG_KEY};"
                  f"BlobEndpoint={web_server}/{AZURITE_ACCOUNT};"}}[scheme]
    cloud_env(env)
    url = f"{scheme}://dlpack-test/some/prefix"
    with pytest.raises(WrongEndpointError) as caught:
        Dataset(url, storage_options={"retries": 1})
    message = str(caught.value)
    assert "the endpoint is not object storage" in message and "answered with a web page" in message
    assert "does not exist" not in message and web_server in message
    report = verify(url, progress=False)
    assert report.exit_code == 4 and "web page" in report.problems[0]["problem"]
    with pytest.raises(ConversionError, match="the endpoint is not object storage"):
        convert(three_images, url, workers=1, progress=False, storage_options={"retries": 1})


@pytest.mark.parametrize("scheme, env", [
    ("s3", {"AWS_ENDPOINT_URL": "127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}),
    ("s3", {"AWS_ENDPOINT_URL": "http://127.0.0.1:99999", "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}),
    ("gs", {"GOOGLE_BASE_URL": "localhost:9", "GOOGLE_SERVICE_ACCOUNT_KEY": ""}),
    ("az", {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": WRONG_KEY,
            "AZURE_STORAGE_ENDPOINT": "127.0.0.1:9/devstoreaccount1"})])
def test_an_endpoint_that_is_not_a_url_is_named_before_any_request(scheme, env, cloud_env,
                                                                  three_images):
    """"minio:9000" without http:// made obstore panic (a PanicException, not an Exception:
    a traceback past every handler); now a StorageError naming it and how to write it."""
    from dlpack_io.reader.remote.storage import StorageError

    cloud_env(env)
    url = f"{scheme}://dlpack-test/some/prefix"
    with pytest.raises(StorageError, match=r"endpoint '[^']+' is not an http\(s\) URL with a "
                                           r"host: write it as http://") as caught:
        Dataset(url)
    assert "attempts" not in str(caught.value)  # refused at once, no request made
    assert verify(url, progress=False).exit_code == 4
    with pytest.raises(ConversionError, match="is not an http"):
        convert(three_images, url, workers=1, progress=False)


@pytest.mark.parametrize("options, words", [
    ({"retries": "x"}, r"storage_options\['retries'\] 'x': expected a whole number"),
    ({"retries": 1.5}, r"storage_options\['retries'\] 1.5: expected a whole number"),
    ({"deadline": -1}, r"storage_options\['deadline'\] -1: expected a finite number of seconds > 0"),
    ({"request_timeout": 0}, r"storage_options\['request_timeout'\] 0: expected a finite number"),
    ({"deadline": float("inf")}, r"storage_options\['deadline'\] inf: expected a finite"),
    ({"request_timeout": "inf"}, r"storage_options\['request_timeout'\] 'inf': expected a "),
    ({"connect_timeout": 1e10}, r"storage_options\['connect_timeout'\] 10000000000.0: "),
    ({"endpoint": "http://127.0.0.1:9", "allow_http": False},
     r"is http:// but allow_http is False: use https://, or allow_http=True"),
    ({"endpoint": "http://127.0.0.1:9", "allow_http": "false"},  # obstore's string form
     r"is http:// but allow_http is False: use https://, or allow_http=True"),
    ({"allow_http": "maybe"}, r"storage_options\['allow_http'\] 'maybe': expected True or "
                              r"False")])
def test_patience_and_http_settings_are_checked_before_any_request(options, words, cloud_env):
    """A bare int() error, a 'not ready after -1.0 s', every request timing out at once, or
    'builder error ... the server failed' after six attempts: each is now named at once."""
    cloud_env({"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    with pytest.raises((ValueError, OSError), match=words):
        Dataset("s3://dlpack-test/some/prefix", storage_options=options)


@pytest.mark.parametrize("given, taken", [("false", False), ("FALSE", False), ("0", False),
                                          ("true", True), ("1", True), (False, False),
                                          (None, True)])
def test_allow_http_as_a_string_is_read_as_obstore_reads_it(given, taken):
    """allow_http='false' (obstore's own config form) was bool('false'): plain HTTP allowed."""
    from dlpack_io.reader.remote.clouds import _client_options

    settings = {"endpoint": "http://minio:9000"} | ({} if given is None else
                                                    {"allow_http": given})
    assert _client_options(settings, 30.0, 10.0)[0]["allow_http"] is taken
