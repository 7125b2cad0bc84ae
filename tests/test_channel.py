"""harness.channel: the signed, sequenced message channel from worker to parent."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from cudal1.harness.channel import MAC_LEN, ChannelError, Message, Receiver, Sender, _mac


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def _messages(key: bytes, n: int = 3) -> list[bytes]:
    conn = FakeConn()
    sender = Sender(conn, key)
    for i in range(n):
        sender.send("phase", name=f"p{i}", value=i)
    return conn.sent


KEY = b"k" * 32


class TestChannel:
    def test_round_trip(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        got = [rx.decode(r) for r in raw]
        assert got == [Message(seq=i, kind="phase", data={"name": f"p{i}", "value": i}) for i in range(3)]

    def test_round_trip_over_a_real_pipe(self):
        recv_conn, send_conn = mp.Pipe(duplex=False)
        try:
            Sender(send_conn, KEY).send("result", status="ok", flags=["cpu_timing"], x=1.5)
            msg = Receiver(KEY).decode(recv_conn.recv_bytes())
        finally:
            recv_conn.close()
            send_conn.close()
        assert msg.kind == "result"
        assert msg.data == {"status": "ok", "flags": ["cpu_timing"], "x": 1.5}

    def test_wrong_key(self):
        raw = _messages(KEY)
        with pytest.raises(ChannelError):
            Receiver(b"x" * 32).decode(raw[0])

    def test_replay(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        rx.decode(raw[0])
        with pytest.raises(ChannelError):
            rx.decode(raw[0])

    def test_out_of_order(self):
        raw = _messages(KEY)
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(raw[1])

    def test_skipped_message(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        rx.decode(raw[0])
        with pytest.raises(ChannelError):
            rx.decode(raw[2])

    def test_forged_seq_in_payload_with_valid_mac(self):
        payload = json.dumps({"seq": 5, "kind": "result", "data": {"status": "ok"}}).encode()
        with pytest.raises(ChannelError, match="out-of-order"):
            Receiver(KEY).decode(_mac(KEY, 0, payload) + payload)

    def test_signed_garbage_payload(self):
        payload = b"\xff\xfe not json"
        with pytest.raises(ChannelError, match="undecodable"):
            Receiver(KEY).decode(_mac(KEY, 0, payload) + payload)

    @pytest.mark.parametrize(
        "raw",
        [
            b"",
            b"hello",
            b"\x00" * MAC_LEN,
            b"{\"seq\": 0, \"kind\": \"result\", \"data\": {\"status\": \"ok\"}}" * 2,
            bytes(range(256)),
        ],
        ids=["empty", "short", "mac-only", "plain-json", "bytes"],
    )
    def test_garbage(self, raw):
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(raw)

    def test_truncated(self):
        raw = _messages(KEY)[0]
        for cut in (1, 5, len(raw) - MAC_LEN - 1):
            with pytest.raises(ChannelError):
                Receiver(KEY).decode(raw[:-cut])
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(raw[:MAC_LEN])

    def test_bit_flip(self):
        raw = bytearray(_messages(KEY)[0])
        raw[-3] ^= 0x01
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(bytes(raw))

    def test_failed_message_does_not_advance(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        with pytest.raises(ChannelError):
            rx.decode(raw[1])
        assert rx.decode(raw[0]).seq == 0
