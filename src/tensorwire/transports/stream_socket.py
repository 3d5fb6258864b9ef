"""The names ``udp/`` imports from here, now in the socket kit
(:mod:`tensorwire.transports.sockets`): this module goes once ``udp/`` imports them from there."""

from tensorwire.transports.sockets import sendmsg_all, tls_error, wait_ready

__all__ = ["sendmsg_all", "tls_error", "wait_ready"]
