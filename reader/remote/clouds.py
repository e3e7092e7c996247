"""The clients of S3 (``s3://``), Google Cloud Storage (``gs://``) and Azure Blob Storage
(``az://``), and how their URLs read: one obstore library, the same retries, budgets and
errors (storage.Store), each cloud's own credential chain and endpoint variables.

``backend(scheme)`` returns the module-like :class:`Backend` for a scheme: how its settings
are resolved, how a client is opened, how settings are shown in messages (secrets left
out) and the words the error messages use.

GCS, first found wins: ``storage_options`` (endpoint, service_account, service_account_key,
application_credentials, bearer_token, anonymous); ``STORAGE_EMULATOR_HOST`` (an emulator:
anonymous requests to that address, as Google's own libraries do); then obstore's own chain, which
reads ``GOOGLE_SERVICE_ACCOUNT`` / ``GOOGLE_SERVICE_ACCOUNT_PATH``,
``GOOGLE_SERVICE_ACCOUNT_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS`` (else
``~/.config/gcloud/application_default_credentials.json``), ``GOOGLE_BASE_URL``, and finally
the instance metadata server.

Azure, first found wins per field: ``storage_options`` (account_name, account_key,
sas_token, endpoint, use_emulator, connection_string); ``AZURE_STORAGE_CONNECTION_STRING``
(AccountName, AccountKey, BlobEndpoint, SharedAccessSignature, UseDevelopmentStorage=true);
then obstore's own chain: ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``,
``AZURE_STORAGE_SAS_TOKEN``, ``AZURE_STORAGE_ENDPOINT``, ``AZURE_STORAGE_USE_EMULATOR``
(Azurite; ``AZURITE_BLOB_STORAGE_URL`` moves it), service principal
(``AZURE_CLIENT_ID`` / ``AZURE_CLIENT_SECRET`` / ``AZURE_TENANT_ID``), workload identity,
managed identity, Azure CLI."""
from __future__ import annotations

import configparser
import datetime
import json
import logging
import os
import re
import threading
from dataclasses import dataclass

# The S3 client (obstore) and where its credentials and endpoint come from.
#
# obstore was chosen by measurement (docs/benchmarks.md, "Choosing the S3 client"): for the
# planner's many concurrent ~100 KB range GETs it served 1.6-3x the requests/s of boto3 with a
# thread pool at 0-20 ms round trip, for a sixth of the CPU. It is an optional extra
# (``pip install dlpack-io[s3]``), imported only when a remote URL is used.
#
# Fork safety: obstore runs a Tokio runtime whose threads do not survive ``fork``; a forked
# child that issues a request hangs. So every store is bound to the process that created it
# (:func:`open_store` callers check ``owner_pid``) and Loader workers never touch the network.
#
# Credentials and endpoint, first found wins, per field:
#   1. the explicit ``storage_options`` argument (keys: endpoint, region, access_key_id,
#      secret_access_key, session_token, profile, allow_http);
#   2. the standard environment variables AWS_ENDPOINT_URL(_S3), AWS_REGION /
#      AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
#   3. the shared files (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials, and
#      AWS_CONFIG_FILE, default ~/.aws/config) for profile AWS_PROFILE (default "default");
#   4. obstore's own chain (instance metadata, web identity) when no key was found.
# Secrets are never logged, never put in an error message and never written to the cache.

log = logging.getLogger(__name__)

INSTALL_HINT = ("reading or writing s3://, gs:// or az:// needs the object-storage extra: "
                "pip install 'dlpack-io[s3]'")
OPTION_KEYS = ("endpoint", "region", "access_key_id", "secret_access_key", "session_token",
               "profile", "allow_http")
# patience settings, also accepted in storage_options (see storage.Policy)
POLICY_KEYS = ("request_timeout", "connect_timeout", "retries", "deadline")
_SECRET_KEYS = ("secret_access_key", "session_token")
MAX_SECONDS = float(threading.TIMEOUT_MAX)  # the longest wait a thread can make (~292 years)


def policy_values(storage_options) -> dict:
    """The patience settings of ``storage_options`` as numbers: ``retries`` a whole number
    >= 0, the others a finite number of seconds > 0 and at most MAX_SECONDS (infinity or
    more made a thread's wait or the client's timeout overflow mid-epoch); ValueError naming
    the key and the value otherwise."""
    out = {}
    for key in POLICY_KEYS:
        if key not in (storage_options or {}):
            continue
        value = storage_options[key]
        try:
            number = int(value) if key == "retries" else float(value)
            ok = (number >= 0 and number == float(value)) if key == "retries" else \
                0 < number <= MAX_SECONDS
        except (TypeError, ValueError):
            ok = False
        if not ok or isinstance(value, bool):
            raise ValueError(f"storage_options[{key!r}] {value!r}: expected "
                             + ("a whole number of retries >= 0" if key == "retries" else
                                f"a finite number of seconds > 0 (at most {MAX_SECONDS:.0f})"))
        out[key] = number
    return out


def import_obstore():
    """The obstore module, or ImportError with the one-line install hint."""
    try:
        import obstore
        import obstore.store  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return obstore


def _shared_files(profile: str) -> dict:
    """Fields of ``profile`` in the shared credentials and config files (if any)."""
    out = {}
    creds = os.environ.get("AWS_SHARED_CREDENTIALS_FILE", os.path.expanduser("~/.aws/credentials"))
    config = os.environ.get("AWS_CONFIG_FILE", os.path.expanduser("~/.aws/config"))
    for path, section in ((config, profile if profile == "default" else f"profile {profile}"),
                          (creds, profile)):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error as exc:
            raise ValueError(f"{path}: not a valid AWS config file ({exc.__class__.__name__})") from None
        if parser.has_section(section):
            for key, name in (("aws_access_key_id", "access_key_id"),
                              ("aws_secret_access_key", "secret_access_key"),
                              ("aws_session_token", "session_token"), ("region", "region"),
                              ("endpoint_url", "endpoint")):
                if parser.has_option(section, key):
                    out[name] = parser.get(section, key)
    return out


def resolve_options(storage_options: dict | None = None) -> dict:
    """Merged connection settings (see the module docstring for the order)."""
    given = {k: v for k, v in (storage_options or {}).items() if k not in POLICY_KEYS}
    unknown = sorted(set(given) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"storage_options: unknown keys {unknown}; expected some of "
                         f"{OPTION_KEYS + POLICY_KEYS}")
    env = os.environ
    from_env = {"endpoint": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
                "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
                "access_key_id": env.get("AWS_ACCESS_KEY_ID"),
                "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
                "session_token": env.get("AWS_SESSION_TOKEN")}
    profile = given.get("profile") or env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") \
        or "default"
    files = _shared_files(profile)
    out = {}
    for key in OPTION_KEYS:
        for source in (given, from_env, files):
            if source.get(key) is not None:
                out[key] = source[key]
                break
    # a key id and its secret belong together: never mix one from env with one from a file
    if ("access_key_id" in given) != ("secret_access_key" in given):
        raise ValueError("storage_options: give access_key_id and secret_access_key together")
    return out


def describe_s3(options: dict) -> str:
    """Settings for messages and logs, secrets left out."""
    shown = {k: v for k, v in options.items() if k not in _SECRET_KEYS}
    if "access_key_id" in shown:
        shown["access_key_id"] = shown["access_key_id"][:4] + "..."
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "defaults"


def open_store(bucket: str, options: dict, *, client: dict, retry: dict):
    """An obstore S3Store for ``bucket``; ``client`` and ``retry`` are obstore's client and
    retry options (clouds.open_client: our timeouts, obstore's retries off)."""
    obstore = import_obstore()
    config = {"region": options.get("region") or "us-east-1"}
    for key in ("endpoint", "access_key_id", "secret_access_key", "session_token"):
        if options.get(key):
            config[key] = options[key]
    if options.get("endpoint"):  # custom endpoints (MinIO, SeaweedFS, R2...) want path-style
        config["virtual_hosted_style_request"] = False
    log.debug("S3 store for bucket %s (%s)", bucket, describe_s3(options))
    return obstore.store.S3Store(bucket, config=config, client_options=client, retry_config=retry)


log = logging.getLogger(__name__)

GCS_KEYS = ("endpoint", "service_account", "service_account_key", "application_credentials",
            "bearer_token", "anonymous", "allow_http")
AZURE_KEYS = ("account_name", "account_key", "sas_token", "endpoint", "use_emulator",
              "connection_string", "allow_http")
_SECRETS = ("secret_access_key", "session_token", "service_account_key", "bearer_token",
            "account_key", "sas_token", "connection_string")


@dataclass(frozen=True)
class Backend:
    """One cloud: how to resolve settings, open a client, and name things in messages."""

    scheme: str
    service: str             # "S3", "GCS", "Azure Blob Storage"
    resolve: object          # (storage_options) -> settings dict
    open: object             # (bucket, settings, client_options, retry) -> obstore store
    hints: dict              # words for failures.classify: bucket, credentials, endpoint


def allow_http_of(settings: dict):
    """``settings["allow_http"]`` as True, False or None (not given): a bool, or a string
    as obstore's own config takes it ("true"/"false", "1"/"0", any case; "false" was once
    ``bool("false")``, plain HTTP allowed); ValueError naming the value otherwise."""
    value = settings.get("allow_http")
    if value is None or isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in ("true", "false", "1", "0"):
        raise ValueError(f"storage_options['allow_http'] {value!r}: expected True or False "
                         f"(or the strings 'true' / 'false')")
    return word in ("true", "1")


def _client_options(settings: dict, request_timeout: float, connect_timeout: float):
    endpoint = settings.get("endpoint") or ""
    allow_http = allow_http_of(settings)
    if allow_http is None:
        allow_http = endpoint.startswith("http://")
    client = {"allow_http": bool(allow_http), "timeout": f"{request_timeout}s",
              "connect_timeout": f"{connect_timeout}s", "pool_max_idle_per_host": "256"}
    retry = {"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=request_timeout)}
    return client, retry  # retries are ours (storage.Store), never obstore's as well


def endpoint_problem(url: str, settings: dict, backend) -> str | None:
    """What is wrong with the endpoint, naming it, unless it is an http(s) URL with a host
    and a valid port (``minio:9000`` without ``http://`` made the client panic inside
    obstore); the caller raises it as a StorageError before any client is made."""
    from urllib.parse import urlsplit

    endpoint, allow_http = settings.get("endpoint"), allow_http_of(settings)
    if not endpoint:
        return None
    try:
        parts = urlsplit(str(endpoint))
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and \
            (parts.port is None or parts.port > 0)
    except ValueError:  # a port out of range, brackets that do not close
        valid = False
    if valid and parts.scheme == "http" and allow_http is False:
        return (f"{url}: endpoint {endpoint!r} is http:// but allow_http is False: "
                f"use https://, or allow_http=True for a server without TLS")
    if not valid:
        hint = f"http://{endpoint}" if "://" not in str(endpoint) else "http://host:port"
        return (f"{url}: endpoint {str(endpoint)!r} is not an http(s) URL with a "
                f"host: write it as {hint} (or https://...) in "
                f"{backend.hints['endpoint']} or storage_options['endpoint']")
    return None


def _check_keys(given: dict, allowed: tuple, scheme: str) -> dict:
    given = {k: v for k, v in (given or {}).items() if k not in POLICY_KEYS}
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"storage_options for {scheme}: unknown keys {unknown}; expected "
                         f"some of {allowed + POLICY_KEYS}")
    return given


# ---- GCS ---------------------------------------------------------------------------------
def _gcs_resolve(storage_options: dict | None) -> dict:
    out = _check_keys(storage_options, GCS_KEYS, "gs://")
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator and "endpoint" not in out and not out.keys() & {"service_account",
                                                                 "service_account_key"}:
        out["endpoint"] = emulator if "://" in emulator else f"http://{emulator}"
        out["anonymous"] = True
    if "endpoint" not in out and os.environ.get("GOOGLE_BASE_URL"):
        out["endpoint"] = os.environ["GOOGLE_BASE_URL"]  # for allow_http and the messages
    return out


def _gcs_open(bucket: str, settings: dict, client: dict, retry: dict):
    import obstore.store

    config = {k: settings[k] for k in ("service_account", "service_account_key",
                                       "application_credentials", "bearer_token")
              if settings.get(k)}
    if settings.get("anonymous"):
        # obstore sends unsigned requests only through a service account file that names
        # the base URL and turns OAuth off (as STORAGE_EMULATOR_HOST does for Google's
        # own libraries)
        config["service_account_key"] = json.dumps({
            "gcs_base_url": settings.get("endpoint") or "https://storage.googleapis.com",
            "disable_oauth": True, "client_email": "", "private_key": "", "private_key_id": ""})
    elif settings.get("endpoint"):
        config["base_url"] = settings["endpoint"]
    return obstore.store.GCSStore(bucket, config=config, client_options=client,
                                  retry_config=retry)


# ---- Azure -------------------------------------------------------------------------------
def parse_connection_string(text: str) -> dict:
    """Settings from an Azure storage connection string (``Key=Value;...``)."""
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    out = {}
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        out["use_emulator"] = True
    for name, key in (("AccountName", "account_name"), ("AccountKey", "account_key"),
                      ("BlobEndpoint", "endpoint"), ("SharedAccessSignature", "sas_token")):
        if fields.get(name):
            out[key] = fields[name]
    if not out:
        raise ValueError("AZURE_STORAGE_CONNECTION_STRING (or storage_options "
                         "connection_string): no AccountName, AccountKey, BlobEndpoint, "
                         "SharedAccessSignature or UseDevelopmentStorage=true in it")
    return out


def _azure_resolve(storage_options: dict | None) -> dict:
    given = _check_keys(storage_options, AZURE_KEYS, "az://")
    text = given.pop("connection_string", None) or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    from_string = parse_connection_string(text) if text else {}
    out = {**from_string, **given}
    env_endpoint = os.environ.get("AZURE_STORAGE_ENDPOINT") or os.environ.get("AZURE_ENDPOINT")
    if "endpoint" not in out and env_endpoint:
        out["endpoint"] = env_endpoint  # obstore reads it too; here for allow_http, messages
    if "endpoint" not in out and (out.get("use_emulator") or os.environ.get(
            "AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true")):
        base = os.environ.get("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:10000").rstrip("/")
        account = out.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") \
            or "devstoreaccount1"
        out["endpoint"] = f"{base}/{account}"  # shown in messages; obstore derives the same
    return out


def _azure_open(bucket: str, settings: dict, client: dict, retry: dict):
    import obstore.store

    config = {k: settings[k] for k in ("account_name", "account_key", "endpoint")
              if settings.get(k)}
    if settings.get("sas_token"):
        config["sas_key"] = settings["sas_token"]
    if settings.get("use_emulator"):
        config["use_emulator"] = True
    return obstore.store.AzureStore(bucket, config=config, client_options=client,
                                    retry_config=retry)


# ---- S3 --------------------------------------------------------------------------
def _s3_open(bucket: str, settings: dict, client: dict, retry: dict):
    return open_store(bucket, settings, client=client, retry=retry)


_BACKENDS = {
    "s3": Backend("s3", "S3", resolve_options, _s3_open, {
        "service": "S3", "bucket": "bucket",
        "credentials": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
                       "storage_options; and that they may use this bucket",
        "endpoint": "AWS_ENDPOINT_URL"}),
    "gs": Backend("gs", "GCS", _gcs_resolve, _gcs_open, {
        "service": "GCS", "bucket": "bucket",
        "credentials": "GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT or "
                       "storage_options; and that they may use this bucket",
        "endpoint": "STORAGE_EMULATOR_HOST / GOOGLE_BASE_URL"}),
    "az": Backend("az", "Azure Blob Storage", _azure_resolve, _azure_open, {
        "service": "Azure Blob Storage", "bucket": "container",
        "credentials": "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY, "
                       "AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_CONNECTION_STRING or "
                       "storage_options; and that they may use this container",
        "endpoint": "AZURE_STORAGE_ENDPOINT, AZURE_STORAGE_USE_EMULATOR / "
                    "AZURITE_BLOB_STORAGE_URL or the connection string's BlobEndpoint"}),
}


def backend(scheme: str) -> Backend:
    """The Backend of ``scheme`` ("s3", "gs" or "az")."""
    return _BACKENDS[scheme]


def open_client(scheme: str, bucket: str, settings: dict, *, request_timeout: float,
                connect_timeout: float):
    """An obstore store for ``bucket`` with our timeouts and obstore's retries off."""
    import_obstore()
    client, retry = _client_options(settings, request_timeout, connect_timeout)
    log.debug("%s store for %s (%s)", scheme, bucket, describe_store(settings))
    return backend(scheme).open(bucket, settings, client, retry)


def describe_store(settings: dict) -> str:
    """Settings for messages and logs, secrets left out."""
    shown = {k: v for k, v in settings.items() if k not in _SECRETS}
    if "access_key_id" in shown:
        shown["access_key_id"] = shown["access_key_id"][:4] + "..."
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "defaults"


# Remote data set URLs (``s3://bucket/prefix``, ``gs://bucket/prefix``,
# ``az://container/prefix``): recognised and parsed without importing the object-storage
# client, so ``import dlpack_io.reader`` and the packer stay light. A URL of any other scheme
# is refused naming the ones we support, never taken for a local folder.

SCHEMES = ("s3://", "gs://", "az://")
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# bucket (container) names, as each service allows them (checked before any request)
_NAMES = {"s3": (re.compile(r"^[A-Za-z0-9.-]{3,}$"), "S3 bucket",
                 "3+ characters: letters, digits, '-', '.'"),
          "gs": (re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$"), "GCS bucket",
                 "3-222 characters: lowercase letters, digits, '-', '_', '.'"),
          "az": (re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$"), "Azure container",
                 "3-63 characters: lowercase letters, digits, single '-' between them")}


_MISTYPED_RE = re.compile(r"^(s3|gs|az):/*(?!/)", re.IGNORECASE)  # S3://, s3:/b, gs:b...


def unsupported_scheme(path) -> str | None:
    """The refusal for a URL whose scheme we do not read (``gcs://``, ``https://``...) or
    one of ours mistyped (``S3://``, ``s3:/bucket``), or None for a supported URL or a
    local path."""
    if isinstance(path, os.PathLike):  # pathlib.Path("s3://b/p") is "s3:/b/p": a str is
        text = os.fspath(path)  # needed, said when the path looks like one of our URLs
        if isinstance(text, str) and _MISTYPED_RE.match(text):
            return f"{_mistyped(text)} (a pathlib.Path merges '//': pass the URL as a str)"
        return None
    if not isinstance(path, str) or path.startswith(SCHEMES):
        return None
    if _MISTYPED_RE.match(path):
        return _mistyped(path)
    match = _URL_RE.match(path)
    if match is None:
        return None
    return (f"{path}: the scheme {match.group(1)}:// is not supported; data sets in object "
            f"storage are read and written at {', '.join(s + '...' for s in SCHEMES)} (S3 "
            f"and S3-compatible stores, Google Cloud Storage, Azure Blob Storage; see "
            f"docs/remote.md), local ones at a folder path")


def _mistyped(path: str) -> str:
    """The refusal of ``path``, one of our URLs mistyped (``S3://b``, ``s3:/b``, ``s3:b``)."""
    mistyped = _MISTYPED_RE.match(path)
    meant = f"{mistyped.group(1).lower()}://{path[mistyped.end():]}"
    return (f"{path}: not a valid URL (a scheme is written lower case and followed by "
            f"'://'): did you mean {meant}? Supported: {', '.join(s + '...' for s in SCHEMES)}")


def is_remote(path) -> bool:
    """True for ``s3://``, ``gs://`` and ``az://`` URLs; ValueError for a URL of any other
    scheme (naming the supported ones); False for a local path."""
    refusal = unsupported_scheme(path)
    if refusal:
        raise ValueError(refusal)
    return isinstance(path, str) and path.startswith(SCHEMES)


def scheme_of(url: str) -> str:
    """"s3", "gs" or "az" of a remote URL."""
    if not is_remote(url):
        raise ValueError(f"{url!r} is not an s3:// URL (nor gs:// or az://)")
    return url.split("://", 1)[0]


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket[/prefix]`` (or gs://, az://container); the prefix
    ends with "/" unless empty."""
    scheme = scheme_of(url)
    if url != url.strip():  # pasted with a newline or a space: never a prefix of that name
        raise ValueError(f"{url!r}: white space around the URL; pass {url.strip()!r}")
    rest = url[len(scheme) + 3:]
    bucket, _, prefix = rest.partition("/")
    pattern, what, rule = _NAMES[scheme]
    if not bucket:
        raise ValueError(f"{url}: no {what} name; write {scheme}://{what.split()[-1]}/prefix "
                         f"(the prefix is the folder of the data set in it)")
    if not pattern.match(bucket):
        raise ValueError(f"{url}: {what} name {bucket!r} is not valid ({rule})")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"{url}: prefix {prefix!r} has empty, '.' or '..' parts")
    return bucket, prefix + "/" if prefix else ""


def canonical(url: str) -> str:
    """``url`` checked (scheme, bucket name, prefix) and written without a trailing "/"
    (``s3://bucket/prefix``): checked first, so ``gs://`` is "no bucket name", never a
    mangled ``gs:``."""
    bucket, prefix = parse_url(url)
    return f"{scheme_of(url)}://{bucket}/{prefix}".rstrip("/")
