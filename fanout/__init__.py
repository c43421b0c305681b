"""fanout: stream OpenAI-style chat completions from many models at once, on trio.

The public API is exactly the names in ``__all__``; everything else is private.
"""

from ._exceptions import EventTooLarge as EventTooLarge
from ._exceptions import FanoutError as FanoutError
from ._exceptions import MalformedFrame as MalformedFrame
from ._exceptions import ProtocolError as ProtocolError
from ._exceptions import ResponseTooLarge as ResponseTooLarge
from .core.accumulate import Accumulator as Accumulator
from .core.chat import ChatChunkInterpreter as ChatChunkInterpreter
from .core.events import CONTENT_EVENTS as CONTENT_EVENTS
from .core.events import ChoiceFinished as ChoiceFinished
from .core.events import ChoiceRole as ChoiceRole
from .core.events import CoreEvent as CoreEvent
from .core.events import DoneReceived as DoneReceived
from .core.events import ErrorReported as ErrorReported
from .core.events import FrameSkipped as FrameSkipped
from .core.events import ReasoningDelta as ReasoningDelta
from .core.events import RefusalDelta as RefusalDelta
from .core.events import ResponseInfo as ResponseInfo
from .core.events import TextDelta as TextDelta
from .core.events import ToolCallDelta as ToolCallDelta
from .core.events import UsageReported as UsageReported
from .core.parser import StreamParser as StreamParser
from .core.parser import parse_stream as parse_stream
from .core.result import ChoiceResult as ChoiceResult
from .core.result import Outcome as Outcome
from .core.result import StreamError as StreamError
from .core.result import StreamResult as StreamResult
from .core.result import ToolCall as ToolCall
from .core.result import Usage as Usage
from .core.sse import ServerSentEvent as ServerSentEvent
from .core.sse import SSEDecoder as SSEDecoder

__version__ = "0.1.0.dev0"

__all__ = [
    "CONTENT_EVENTS",
    "Accumulator",
    "ChatChunkInterpreter",
    "ChoiceFinished",
    "ChoiceResult",
    "ChoiceRole",
    "CoreEvent",
    "DoneReceived",
    "ErrorReported",
    "EventTooLarge",
    "FanoutError",
    "FrameSkipped",
    "MalformedFrame",
    "Outcome",
    "ProtocolError",
    "ReasoningDelta",
    "RefusalDelta",
    "ResponseInfo",
    "ResponseTooLarge",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamError",
    "StreamParser",
    "StreamResult",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "UsageReported",
    "parse_stream",
]
