"""Whether Google Cloud Storage can be reached, asked with one bounded request before TensorFlow's ``gfile`` first
touches a ``gs://`` workdir: offline, gfile retries a failed request ten times with exponential back-off, about
200 s before its error (through a proxy that refuses the tunnel, measured), or fails at once when the host name does
not resolve.

One HTTPS request to the storage endpoint (``GCS_URL``), through the proxy the environment names (``HTTPS_PROXY``,
``NO_PROXY``, ...) as gfile's curl does, bounded by ``CONNECT_TIMEOUT_S``. Any HTTP answer, whatever its status
(an anonymous request is refused), and a TLS failure (a proxy with its own certificates, which curl may trust)
count as reachable: only a name that does not resolve, a connection refused or timed out, or a proxy that refuses
the tunnel stop the run.
"""
from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.parse
import urllib.request

CONNECT_TIMEOUT_S = 10
GCS_URL = "https://storage.googleapis.com/"
GCS_ENDPOINT_VARIABLES = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")   # another endpoint than GCS's


def _proxy(url: str) -> str | None:
    host = urllib.parse.urlsplit(url).hostname
    proxy = urllib.request.getproxies().get("https")
    return None if not proxy or urllib.request.proxy_bypass(host) else proxy


def cloud_storage_problem(timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when Google Cloud Storage's endpoint answers (or another endpoint is configured, which this does not
    probe); else ``"https://storage.googleapis.com/ cannot be reached[ through the proxy P] (cause)"``."""
    if any(os.environ.get(name) for name in GCS_ENDPOINT_VARIABLES):
        return None
    try:
        opener = urllib.request.build_opener()          # the proxies of the environment now
        opener.open(urllib.request.Request(GCS_URL, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:            # an answer
        return None
    except (urllib.error.URLError, OSError) as err:
        cause = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(cause, ssl.SSLError):   # connected; certificates are the storage client's business
            return None
        proxy = _proxy(GCS_URL)
        via = f" through the proxy {proxy}" if proxy else ""
        text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
        return f"{GCS_URL} cannot be reached{via} ({text})"
    return None


def cloud_path_problem(path, field: str) -> str | None:
    """For a ``gs://`` path (``paths.as_path``'s) whose storage cannot be reached: ``"FIELD=PATH: <the endpoint>
    cannot be reached (cause); check the network ..."``; None for a local path or a reachable endpoint. Asked where a
    run takes such a path in, before anything reads it (gfile's retries, TFDS's 56-line trace)."""
    if not os.fspath(path).startswith("gs://"):
        return None
    problem = cloud_storage_problem()
    if problem is None:
        return None
    return (f"{field}={os.fspath(path)}: {problem}; check the network (or HTTPS_PROXY) and the credentials "
            "(gcloud auth application-default login)")
