"""The recording gateway: real harness CLIs talk to a ``Policy`` through it, token-exact.

See docs/gateway.md. ``Session`` holds one episode's record; ``GatewayServer``
serves it over a Unix socket (mounted into the sandbox) or a loopback port.
"""

from rollout.gateway.app import GatewayServer, ThreadedGateway, make_app
from rollout.gateway.session import BudgetSpent, Reply, Session, ToolCall
from rollout.gateway.types import Api, BreakCause, CallRecord, GatewayError, HistoryBreak

__all__ = ["Api", "BreakCause", "BudgetSpent", "CallRecord", "GatewayError", "GatewayServer", "HistoryBreak", "Reply",
           "Session", "ThreadedGateway", "ToolCall", "make_app"]
