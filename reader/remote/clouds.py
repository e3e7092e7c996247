"""The clients of Google Cloud Storage (``gs://``) and Azure Blob Storage (``az://``), beside
S3 (reader/remote/s3client.py): the same obstore library, the same retries, budgets and
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
managed identity, Azure CLI.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
from dataclasses import dataclass

from dlpack_io.reader.remote import s3client

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


def check_endpoint(url: str, settings: dict, backend) -> None:
    """StorageError naming the endpoint unless it is an http(s) URL with a host and a valid
    port (``minio:9000`` without ``http://`` made the client panic inside obstore)."""
    from urllib.parse import urlsplit

    from dlpack_io.reader.remote.failures import StorageError

    endpoint, allow_http = settings.get("endpoint"), allow_http_of(settings)
    if not endpoint:
        return
    try:
        parts = urlsplit(str(endpoint))
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and \
            (parts.port is None or parts.port > 0)
    except ValueError:  # a port out of range, brackets that do not close
        valid = False
    if valid and parts.scheme == "http" and allow_http is False:
        raise StorageError(f"{url}: endpoint {endpoint!r} is http:// but allow_http is False: "
                           f"use https://, or allow_http=True for a server without TLS")
    if not valid:
        hint = f"http://{endpoint}" if "://" not in str(endpoint) else "http://host:port"
        raise StorageError(f"{url}: endpoint {str(endpoint)!r} is not an http(s) URL with a "
                           f"host: write it as {hint} (or https://...) in "
                           f"{backend.hints['endpoint']} or storage_options['endpoint']")


def _check_keys(given: dict, allowed: tuple, scheme: str) -> dict:
    given = {k: v for k, v in (given or {}).items() if k not in s3client.POLICY_KEYS}
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"storage_options for {scheme}: unknown keys {unknown}; expected "
                         f"some of {allowed + s3client.POLICY_KEYS}")
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


# ---- S3 (s3client.py) --------------------------------------------------------------------
def _s3_open(bucket: str, settings: dict, client: dict, retry: dict):
    return s3client.open_store(bucket, settings, client=client, retry=retry)


_BACKENDS = {
    "s3": Backend("s3", "S3", s3client.resolve_options, _s3_open, {
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
    s3client.import_obstore()
    client, retry = _client_options(settings, request_timeout, connect_timeout)
    log.debug("%s store for %s (%s)", scheme, bucket, describe(settings))
    return backend(scheme).open(bucket, settings, client, retry)


def describe(settings: dict) -> str:
    """Settings for messages and logs, secrets left out."""
    shown = {k: v for k, v in settings.items() if k not in _SECRETS}
    if "access_key_id" in shown:
        shown["access_key_id"] = shown["access_key_id"][:4] + "..."
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "defaults"
