"""The S3 client (obstore) and where its credentials and endpoint come from.

obstore was chosen by measurement (docs/benchmarks.md, "Choosing the S3 client"): for the
planner's many concurrent ~100 KB range GETs it served 1.6-3x the requests/s of boto3 with a
thread pool at 0-20 ms round trip, for a sixth of the CPU. It is an optional extra
(``pip install dlpack-io[s3]``), imported only when a remote URL is used.

Fork safety: obstore runs a Tokio runtime whose threads do not survive ``fork``; a forked
child that issues a request hangs. So every store is bound to the process that created it
(:func:`open_store` callers check ``owner_pid``) and Loader workers never touch the network.

Credentials and endpoint, first found wins, per field:
  1. the explicit ``storage_options`` argument (keys: endpoint, region, access_key_id,
     secret_access_key, session_token, profile, allow_http);
  2. the standard environment variables AWS_ENDPOINT_URL(_S3), AWS_REGION /
     AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
  3. the shared files (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials, and
     AWS_CONFIG_FILE, default ~/.aws/config) for profile AWS_PROFILE (default "default");
  4. obstore's own chain (instance metadata, web identity) when no key was found.
Secrets are never logged, never put in an error message and never written to the cache.
"""
from __future__ import annotations

import configparser
import logging
import os
import threading

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


def describe(options: dict) -> str:
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
    log.debug("S3 store for bucket %s (%s)", bucket, describe(options))
    return obstore.store.S3Store(bucket, config=config, client_options=client, retry_config=retry)
