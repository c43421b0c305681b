"""The embedded upstream: scripted models, faults and capture replay, in three dialects
(``POST /v1/chat/completions``, ``/v1/responses``, Anthropic's ``/v1/messages``).

``fanout mock`` serves it on the command line; ``serve_upstream`` /
``open_upstream`` run it inside a trio program or a test.
"""

from .capture import Capture as Capture
from .catalog import MODELS as MODELS
from .server import RunningUpstream as RunningUpstream
from .server import UpstreamStats as UpstreamStats
from .server import open_upstream as open_upstream
from .server import serve_upstream as serve_upstream

__all__ = ["MODELS", "Capture", "RunningUpstream", "UpstreamStats", "open_upstream",
           "serve_upstream"]
