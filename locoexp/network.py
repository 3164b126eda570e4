"""`answers(url)`: whether a server accepts a TCP connection within a bound (2 s by default).

Start-up checks use it to refuse, in seconds, what would otherwise retry for half a minute or
more (the Hugging Face Hub, the W&B server) on a machine without network. It opens and closes
one connection and sends nothing: it must not make requests or read credentials.
"""

import socket
import urllib.parse

PROBE_TIMEOUT_S = 2.0


def answers(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when the host of `url` accepts a connection on its port within `timeout_s`."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:  # no DNS, refused, unreachable or timed out
        return False
