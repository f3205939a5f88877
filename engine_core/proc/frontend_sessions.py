"""The engine core's table of frontend sessions, kept by its IO thread (no locks: one thread owns it).

A session begins when a frontend says HELLO and ends when the frontend says GOODBYE, its connection
drops, it is silent for `silent_seconds`, the core cannot send to it (it does not read), or it says
HELLO again (without `resume`) after it sent work (it starts afresh: it lost the core for a while).

Invariants:
- one session per routing identity, bound to the connection it said HELLO on (the socket's file
  descriptor) and, with CURVE, to the frontend's public key: a frame from another connection or key
  does not belong to it.
- each session has its own key (the identity plus a counter) that the busy loop uses in place of the
  identity; outputs for a key whose session has ended are dropped, so a later session of the same
  identity never receives an earlier session's outputs.
- the full READY (with the tokenizer files, megabytes) goes at most once per connection; HELLOs are
  answered at most once per HELLO_ANSWER_SECONDS per session (frontends repeat HELLO every second).
"""

import itertools
import math
from dataclasses import dataclass

HELLO_ANSWER_SECONDS = 0.5  # a frontend repeats HELLO every 1 s until READY: never throttled, a flood is


@dataclass(eq=False)
class Session:
    identity: bytes  # the frontend's ZeroMQ routing id
    key: bytes  # what the busy loop knows this session by
    fd: int  # the connection it said HELLO on
    user_id: str | None  # its CURVE public key (Z85), None without CURVE
    name: str  # the client name it gave in HELLO
    last_heard: float
    last_sent: float
    last_hello_answer: float = -math.inf
    has_work: bool = False  # it sent ADD in this session

    @property
    def tag(self) -> str:
        return self.identity.hex()[:8]


class FrontendSessions:
    def __init__(self, silent_seconds: float):
        self.silent_seconds = silent_seconds
        self._by_identity: dict[bytes, Session] = {}
        self._by_key: dict[bytes, Session] = {}
        self._full_ready: set[tuple[int, bytes]] = set()  # (fd, identity): connections that had the files
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._by_identity)

    def keys(self) -> tuple[bytes, ...]:
        """The live sessions' keys; safe to call from another thread (one C-level copy under the GIL)."""
        return tuple(self._by_key)

    def start(self, identity: bytes, fd: int, user_id: str | None, name: str, now: float) -> Session:
        """A new session for `identity`; the caller has ended the one it had."""
        assert identity not in self._by_identity
        key = identity + next(self._counter).to_bytes(8, "big")
        session = Session(identity, key, fd, user_id, name, last_heard=now, last_sent=now)
        self._by_identity[identity] = session
        self._by_key[key] = session
        return session

    def get(self, identity: bytes) -> Session | None:
        return self._by_identity.get(identity)

    def by_key(self, key: bytes) -> Session | None:
        return self._by_key.get(key)

    def find(self, identity: bytes, fd: int, user_id: str | None) -> Session | None:
        """The session a frame from this identity, connection and key belongs to, if any."""
        session = self._by_identity.get(identity)
        if session is None or session.fd != fd or session.user_id != user_id:
            return None
        return session

    def end(self, session: Session) -> bool:
        """Forgets `session`; False if it had already ended."""
        if self._by_key.pop(session.key, None) is None:
            return False
        del self._by_identity[session.identity]
        return True

    def connection_closed(self, fd: int) -> list[Session]:
        """The connection on `fd` is gone (or `fd` now holds a new one): the sessions on it, to end."""
        self._full_ready = {(f, i) for f, i in self._full_ready if f != fd}
        return [s for s in self._by_identity.values() if s.fd == fd]

    def take_full_ready(self, session: Session) -> bool:
        """True the first time per connection: send the READY with the tokenizer files."""
        connection = (session.fd, session.identity)
        if connection in self._full_ready:
            return False
        self._full_ready.add(connection)
        return True

    def may_answer_hello(self, session: Session, now: float) -> bool:
        if now - session.last_hello_answer < HELLO_ANSWER_SECONDS:
            return False
        session.last_hello_answer = now
        return True

    def silent(self, now: float) -> list[Session]:
        return [s for s in self._by_identity.values() if now - s.last_heard > self.silent_seconds]

    def heartbeat_due(self, now: float, interval: float) -> list[Session]:
        return [s for s in self._by_identity.values() if now - s.last_sent >= interval]
