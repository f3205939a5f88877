"""Connection limits uvicorn does not have: a deadline for the request head, and a cap on open
connections that answers the surplus with an OpenAI 503 instead of serving it.

uvicorn (0.54) closes idle keep-alive connections, but a client that sends half a request line and
then nothing holds its connection forever, and its `limit_concurrency` answers plain-text 503s
counted against in-flight tasks too. This is its h11 protocol with two additions:
- a timer armed when a connection opens and after each response, cancelled once a complete
  request head has arrived; when it fires while no request is being served, the connection closes;
- a connection that opens while --max-connections are already open is answered 503 (with
  `Connection: close`) on its first request, and is closed by the same timer if it sends none.
"""

import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

from frontend.endpoints.serving.errors import APIError
from frontend.endpoints.serving.limits import HTTPLimits

logger = logging.getLogger("nvllm")


def too_many_connections(limit: int) -> APIError:
    return APIError(503, f"the server has too many open connections (--max-connections {limit}); retry shortly",
                    code="too_many_connections", headers={"Retry-After": "1", "Connection": "close"})


class GuardedH11Protocol(H11Protocol):
    header_timeout: float = 15.0  # 0: none
    max_connections: int = 1024  # 0: no cap

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        if self.max_connections and len(self.connections) > self.max_connections:
            logger.warning("refusing a connection from %s: %d open, more than --max-connections %d",
                           "%s:%d" % self.client if self.client else "?", len(self.connections),
                           self.max_connections)
            self.app = self._refuse
        self._arm_head_timer()

    async def _refuse(self, scope, receive, send) -> None:
        await too_many_connections(self.max_connections).response()(scope, receive, send)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        if self.header_timeout:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being served: its head came in time
        logger.debug("closing a connection from %s: no complete request head within %s s",
                     "%s:%d" % self.client if self.client else "?", self.header_timeout)
        self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:  # a whole request head has arrived
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()  # the next request's head is due in time too

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


def protocol_class(limits: HTTPLimits) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config(http=...), with the limits' values."""
    return type("NvllmH11Protocol", (GuardedH11Protocol,),
                {"header_timeout": limits.request_header_timeout, "max_connections": limits.max_connections})
