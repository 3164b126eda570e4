"""`answers(url)`: whether a server accepts a TCP connection within a bound (2 s by default).

Start-up checks use it to refuse, in seconds, what would otherwise retry for half a minute or
more (the Hugging Face Hub, the W&B server) on a machine without network. It opens and closes
one connection (to the proxy, where one is configured) and sends nothing: it must not make
requests or read credentials.
"""

import socket
import urllib.parse
import urllib.request

PROBE_TIMEOUT_S = 2.0


def answers(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when the host of `url` accepts a connection on its port within `timeout_s`; behind
    an HTTP(S) proxy from the environment (HTTPS_PROXY, ...), when the proxy does."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:  # no DNS, refused, unreachable or timed out
        return False
