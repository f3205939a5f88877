"""The HELLO/READY handshake as both ends of a core link see it from the outside: the HELLO frames a
client sends (again every HELLO_INTERVAL_SECONDS until an answer), and what an answer says. Used by
the frontends' core clients and by `nvllm engine-core --check`; the core's side is core_proc.py."""

import msgspec

from common import wire_messages as P

HELLO_INTERVAL_SECONDS = 1.0  # how often HELLO is repeated while no READY has come

_encoder = msgspec.msgpack.Encoder()
_ready_decoder = msgspec.msgpack.Decoder(P.Ready)
_text_decoder = msgspec.msgpack.Decoder(str)


class CoreRejected(RuntimeError):
    """The core answered REJECTED (its reason is the message)."""


def hello_frames(client_name: str, resume: bool = False) -> list[bytes]:
    return [P.HELLO, _encoder.encode(P.Hello(P.PROTOCOL_VERSION, client_name, resume))]


def read_answer(kind: bytes, body: bytes) -> P.Ready | None:
    """A READY's contents; None for any other frame; CoreRejected for REJECTED."""
    if kind == P.READY:
        return _ready_decoder.decode(body)
    if kind == P.REJECTED:
        raise CoreRejected(_text_decoder.decode(body))
    return None
