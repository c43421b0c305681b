"""``fanout serve``: the fan-out as an HTTP service (Starlette on Hypercorn's trio worker).

``open_service(config, endpoint)`` builds the shared state, ``create_app``
the ASGI app (routes in ``app.py``), ``serve_app`` serves it.  The service
only consumes the library: each request is one ``open_fanout``, its events
re-encoded as the records of ``fanout.records``; it parses no upstream byte.
Needs the ``serve`` extra: ``pip install 'fanout[serve]'``.
"""

from .app import ROUTES as ROUTES
from .app import create_app as create_app
from .keys import ServiceKeys as ServiceKeys
from .run import is_loopback as is_loopback
from .run import serve_app as serve_app
from .service import Service as Service
from .service import open_service as open_service

__all__ = ["ROUTES", "Service", "ServiceKeys", "create_app", "is_loopback", "open_service",
           "serve_app"]
