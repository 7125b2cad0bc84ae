"""The verdict channel: signed JSON messages from a worker child to its parent.

Contract: the parent reads raw bytes (never unpickles) from a one-way pipe; each message carries
an HMAC-SHA256 over a sequence number and payload, keyed by a secret the parent generated for
that child.  Text a candidate prints to stdout/stderr, or bytes it writes to inherited file
descriptors, therefore cannot produce a verdict: unsigned, mis-signed, replayed or out-of-order
messages are reported as tampering.

Inside the worker the key is not held by a :class:`Sender`: the worker's audit hook
(:mod:`cudal1.harness.child.signing_hook`) writes the same wire format (4-byte length, MAC, JSON with
``seq``/``kind``/``data``) and signs only for the judge's own call chain; ``Sender`` remains the
reference implementation of the format (tests, tools).

Limit (documented, not fixable in-process): code running inside the worker can, in principle,
read the signing state out of the worker's memory (``ctypes``, or code disguised as library code
that reaches the hook's frame; see docs/harness.md).  The audit hook and runtime guards make
that costly and detectable, not impossible; see ``cudal1.harness`` for what in-process isolation
cannot prevent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

MAC_LEN = 32
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class ChannelError(Exception):
    """A message failed verification (forged, malformed, replayed)."""


def _mac(key: bytes, seq: int, payload: bytes) -> bytes:
    return hmac.new(key, seq.to_bytes(8, "little") + payload, hashlib.sha256).digest()


class Sender:
    """Child side.  ``send(kind, **data)``; messages are numbered from 0."""

    def __init__(self, conn: Any, key: bytes) -> None:
        self._conn = conn
        self._key = key
        self._seq = 0

    def send(self, kind: str, **data: Any) -> None:
        payload = json.dumps({"seq": self._seq, "kind": kind, "data": data}, default=str).encode()
        self._conn.send_bytes(_mac(self._key, self._seq, payload) + payload)
        self._seq += 1


@dataclass
class Message:
    seq: int
    kind: str
    data: dict[str, Any]


class Receiver:
    """Parent side.  ``decode(raw)`` verifies and returns a :class:`Message` or raises."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._next = 0

    def decode(self, raw: bytes) -> Message:
        if len(raw) <= MAC_LEN or len(raw) > MAX_MESSAGE_BYTES:
            raise ChannelError("malformed message on the verdict channel")
        mac, payload = raw[:MAC_LEN], raw[MAC_LEN:]
        if not hmac.compare_digest(mac, _mac(self._key, self._next, payload)):
            raise ChannelError("unsigned or mis-signed message on the verdict channel")
        try:
            obj = json.loads(payload)
        except ValueError:
            raise ChannelError("undecodable message on the verdict channel") from None
        if obj.get("seq") != self._next:
            raise ChannelError("out-of-order message on the verdict channel")
        self._next += 1
        return Message(seq=obj["seq"], kind=str(obj["kind"]), data=dict(obj.get("data") or {}))
