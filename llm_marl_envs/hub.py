"""Whether to ask the Hugging Face hub: its offline variables first, then one quick connection check.

The hub's clients retry a connection that fails for about half a minute (five tries with growing
waits) before they give up, so a machine without network would wait that long before each local
fallback or error. The data and model loaders ask here first:

* an offline variable set to a true value (``1``, ``true``, ``yes``, ``on``) means that the hub
  is not asked; the libraries then read only their local caches, which they do at once
  (``HF_HUB_OFFLINE`` for both, ``HF_DATASETS_OFFLINE`` for datasets, ``TRANSFORMERS_OFFLINE`` for
  models);
* otherwise one TCP connection to the hub's host (``HF_ENDPOINT``, default
  ``https://huggingface.co``, or the proxy in ``HTTPS_PROXY`` / ``ALL_PROXY`` in front of it) within
  :data:`HUB_CHECK_TIMEOUT_S` decides, once per process: an unreachable hub is not asked.
"""
from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import urlsplit

HUB_CHECK_TIMEOUT_S = 3.0
"""Seconds the connection check waits for the hub (or its proxy) to answer."""

DEFAULT_ENDPOINT = "https://huggingface.co"
DATASETS_OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
MODELS_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE_VALUES = {"1", "true", "yes", "on"}


def offline_variable(names: Iterable[str]) -> str | None:
    """``"NAME=value"`` for the first of ``names`` set to a true value, else ``None``."""
    for name in names:
        value = os.environ.get(name, "")
        if value.strip().lower() in _TRUE_VALUES:
            return f"{name}={value}"
    return None


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (``host:port: error``), else ``None``; checked once per process and address."""
    host, port = hub_address()
    return _connection_problem(host, port, HUB_CHECK_TIMEOUT_S)


def hub_address() -> tuple[str, int]:
    """``(host, port)`` a hub request connects to first: the endpoint's, or its proxy's."""
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    secure = endpoint.scheme != "http"
    host = endpoint.hostname or "huggingface.co"
    no_proxy = {entry.strip().lower() for entry in _environ("NO_PROXY", "no_proxy").split(",")}
    proxy = _environ(*(("HTTPS_PROXY", "https_proxy") if secure else ("HTTP_PROXY", "http_proxy")),
                     "ALL_PROXY", "all_proxy")
    if proxy and host.lower() not in no_proxy and "*" not in no_proxy:
        address = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return address.hostname or proxy, address.port or (443 if address.scheme == "https" else 80)
    return host, endpoint.port or (443 if secure else 80)


def _environ(*names: str) -> str:
    """The value of the first of ``names`` that is set and not empty, else ``""``."""
    return next((os.environ[name] for name in names if os.environ.get(name)), "")


@lru_cache(maxsize=8)
def _connection_problem(host: str, port: int, timeout_s: float) -> str | None:
    """Open and close one TCP connection to ``host:port``; the error, or ``None`` when it connects in time."""
    outcome: list[str | None] = []

    def connect() -> None:                      # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as error:
            outcome.append(f"{host}:{port}: {error}")

    thread = threading.Thread(target=connect, name="hub-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return outcome[0] if outcome else f"{host}:{port}: no answer within {timeout_s:g} s"


__all__ = ["DATASETS_OFFLINE_VARIABLES", "HUB_CHECK_TIMEOUT_S", "MODELS_OFFLINE_VARIABLES", "hub_address",
           "hub_unreachable", "offline_variable"]
