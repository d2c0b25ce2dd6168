"""A thin JSON transport to the Kubernetes API: paged lists, watch streams, object writes.

Role: the I/O under the Kubernetes syncer and client. It uses the `kubernetes` package for
what it is good at - finding and loading credentials (in-cluster service account, or a
kubeconfig from KUBECONFIG / ~/.kube/config, with TLS and token refresh) and its
urllib3-based REST client - but sends raw requests and keeps the JSON as dicts: typed
models would rename fields (snake_case) and cost time on every Pod.

Inputs: a `ResourceType` (`agent.syncer.kube_resources`) plus query parameters.
Outputs: decoded JSON (`dict`), or for a watch a `WatchStream` yielding one event dict
(`{"type": ..., "object": {...}}`) per line of the chunked response.

Errors: `KubeGone` (HTTP 410: a continue token or resourceVersion too old), `KubeNotFound`
(404), `KubeConflict` (409), `KubeHTTPError` (any other non-2xx status, with the server's
Status message), `KubeUnavailable` (no connection, a timeout, a broken stream).

Decoding goes through `agent.inputs.decode_json`: a duplicate key, an over-long number or
a subtree nested too deep to decode inside ONE object of a list page or watch event is left
as a marker for the syncer's per-object check (`agent.inputs.check_document`), so it
rejects that object only, never the page or the stream.

Invariants: every request has a timeout - a watch's read timeout is its `timeoutSeconds`
plus a margin, so a silent dead connection is given up, not waited on forever; a watch
stream can be closed from another thread (`close()` shuts the socket down, which wakes the
reader).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3

from pyfelix.agent.inputs import decode_json
from pyfelix.agent.kinds import ResourceType

WATCH_READ_MARGIN = 30.0
# Levels around the objects: {"object": obj}; {"items": [obj, ...]}.
_EVENT_WRAPPER_DEPTH = 1
_LIST_WRAPPER_DEPTH = 2


class KubeError(Exception):
    """Base of the errors this module raises."""


class KubeUnavailable(KubeError):
    """The API server could not be reached, timed out, or broke the stream."""


class KubeHTTPError(KubeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KubeGone(KubeHTTPError):
    """410 Gone: the resourceVersion or continue token is older than the server keeps."""


class KubeNotFound(KubeHTTPError):
    """404: no such object (or the resource type is not served, e.g. a CRD not installed)."""


class KubeConflict(KubeHTTPError):
    """409: the object already exists, or changed since the resourceVersion given."""


def http_error(status: int, body: bytes | str, what: str) -> KubeHTTPError:
    """The error for a non-2xx answer, with the message of its Status object if any."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    message = text.strip()[:500]
    try:
        decoded = decode_json(text)
        if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
            message = str(decoded["message"])
    except ValueError:
        pass
    full = f"{what}: HTTP {status}: {message}"
    error_class = {404: KubeNotFound, 409: KubeConflict, 410: KubeGone}.get(status, KubeHTTPError)
    return error_class(status, full)


def load_configuration(kubeconfig: str | None = None,
                       context: str | None = None) -> kubernetes.client.Configuration:
    """Credentials as kubectl finds them: `kubeconfig` or $KUBECONFIG if set, else the
    in-cluster service account when running in a pod, else ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        if not path and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(config_file=path, context=context,
                                               client_configuration=configuration,
                                               persist_config=False)
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = path or "~/.kube/config (KUBECONFIG unset, not in a cluster)"
        raise KubeError(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
    return configuration


class WatchStream:
    """The events of one watch request, decoded line by line."""

    def __init__(self, response: Any, what: str) -> None:
        self._response = response
        self._what = what
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        buffer = b""
        try:
            for chunk in self._response.stream(amt=None, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield self._decode(line)
            if buffer.strip():
                yield self._decode(buffer)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._closed.is_set():
                return
            raise KubeUnavailable(f"{self._what}: the watch stream broke: {exc}") from exc
        finally:
            self._response.release_conn()

    def _decode(self, line: bytes) -> dict[str, Any]:
        try:
            event = decode_json(line, wrapper_depth=_EVENT_WRAPPER_DEPTH)
        except ValueError as exc:
            raise KubeUnavailable(f"{self._what}: undecodable watch event {line[:200]!r}") from exc
        if not isinstance(event, dict):
            raise KubeUnavailable(f"{self._what}: watch event is not an object: {line[:200]!r}")
        return event

    def close(self) -> None:
        """Stop the stream; safe from any thread, and more than once."""
        self._closed.set()
        try:
            self._response.shutdown()
        except Exception:  # already closed or never connected: nothing to wake
            pass
        self._response.close()


class KubeAPI:
    """Raw JSON requests through a `kubernetes.client.ApiClient`."""

    def __init__(self, configuration: kubernetes.client.Configuration, *,
                 request_timeout: float = 10.0, connection_pool_size: int = 32) -> None:
        self.configuration = configuration
        self.request_timeout = request_timeout
        # One long-lived connection per watched type, plus room for lists and writes.
        configuration.connection_pool_maxsize = max(
            configuration.connection_pool_maxsize or 0, connection_pool_size)
        self._client = kubernetes.client.ApiClient(configuration)

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, context: str | None = None,
                         **options: Any) -> KubeAPI:
        return cls(load_configuration(kubeconfig, context), **options)

    @property
    def host(self) -> str:
        return str(self.configuration.host)

    def close(self) -> None:
        self._client.close()

    def _send(self, method: str, path: str, query: list[tuple[str, Any]] | None = None,
              body: Any = None, timeout: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            method, url, headers, body, post = self._client.param_serialize(
                method, path, query_params=query or [], header_params=headers, body=body,
                auth_settings=["BearerToken"])
            response = self._client.call_api(
                method, url, header_params=headers, body=body, post_params=post,
                _request_timeout=timeout or self.request_timeout)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{method} {self.host}{path}: {exc}") from exc
        except kubernetes.client.exceptions.ApiException as exc:
            raise KubeUnavailable(f"{method} {self.host}{path}: {exc.reason}") from exc
        return response

    def request_json(self, method: str, path: str, query: list[tuple[str, Any]] | None = None,
                     body: Any = None) -> dict[str, Any]:
        """One request; the decoded JSON answer, or the error its status means."""
        response = self._send(method, path, query, body)
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{method} {self.host}{path}: {exc}") from exc
        if not 200 <= response.status < 300:
            raise http_error(response.status, data, f"{method} {path}")
        try:
            decoded = decode_json(data, wrapper_depth=_LIST_WRAPPER_DEPTH)
        except ValueError as exc:
            raise KubeUnavailable(f"{method} {path}: the answer is not JSON") from exc
        if not isinstance(decoded, dict):
            raise KubeUnavailable(f"{method} {path}: the answer is not a JSON object")
        return decoded

    def list_page(self, rtype: ResourceType, *, limit: int, continue_token: str = "",
                  namespace: str | None = None) -> dict[str, Any]:
        query: list[tuple[str, Any]] = [("limit", limit)]
        if continue_token:
            query.append(("continue", continue_token))
        return self.request_json("GET", rtype.collection_path(namespace), query)

    def watch(self, rtype: ResourceType, resource_version: str, *, timeout_seconds: int,
              bookmarks: bool = True) -> WatchStream:
        """Open a watch from `resource_version` (events strictly after it)."""
        path = rtype.collection_path()
        query: list[tuple[str, Any]] = [("watch", "true"), ("resourceVersion", resource_version),
                                        ("timeoutSeconds", timeout_seconds)]
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        read_timeout = timeout_seconds + WATCH_READ_MARGIN
        response = self._send("GET", path, query,
                              timeout=(self.request_timeout, read_timeout))
        if not 200 <= response.status < 300:
            data = response.read()
            raise http_error(response.status, data, f"watch {path}")
        return WatchStream(response.response, f"watch {self.host}{path}")
