"""fanout: stream OpenAI-style chat completions from many models at once, on trio.

The public API is exactly the names in ``__all__``; everything else is private.
"""

from ._channel import EventChannel as EventChannel
from ._exceptions import ConfigError as ConfigError
from ._exceptions import EventTooLarge as EventTooLarge
from ._exceptions import FanoutError as FanoutError
from ._exceptions import MalformedFrame as MalformedFrame
from ._exceptions import ProtocolError as ProtocolError
from ._exceptions import ResponseTooLarge as ResponseTooLarge
from ._gc import tune_gc as tune_gc
from .config import Config as Config
from .config import ModelConfig as ModelConfig
from .config import load_config as load_config
from .core.accumulate import Accumulator as Accumulator
from .core.chat import ChatChunkInterpreter as ChatChunkInterpreter
from .core.events import CONTENT_EVENTS as CONTENT_EVENTS
from .core.events import ChoiceFinished as ChoiceFinished
from .core.events import ChoiceRole as ChoiceRole
from .core.events import ContentEvent as ContentEvent
from .core.events import CoreEvent as CoreEvent
from .core.events import DoneReceived as DoneReceived
from .core.events import ErrorReported as ErrorReported
from .core.events import Event as Event
from .core.events import FrameSkipped as FrameSkipped
from .core.events import ReasoningDelta as ReasoningDelta
from .core.events import RefusalDelta as RefusalDelta
from .core.events import ResponseInfo as ResponseInfo
from .core.events import StreamFinished as StreamFinished
from .core.events import StreamRetrying as StreamRetrying
from .core.events import StreamStarted as StreamStarted
from .core.events import TextDelta as TextDelta
from .core.events import ThinkingBlockFinished as ThinkingBlockFinished
from .core.events import ToolCallDelta as ToolCallDelta
from .core.events import UsageReported as UsageReported
from .core.parser import StreamParser as StreamParser
from .core.parser import parse_stream as parse_stream
from .core.result import Attempt as Attempt
from .core.result import ChoiceResult as ChoiceResult
from .core.result import Flag as Flag
from .core.result import Outcome as Outcome
from .core.result import StreamError as StreamError
from .core.result import StreamResult as StreamResult
from .core.result import ThinkingBlock as ThinkingBlock
from .core.result import Timings as Timings
from .core.result import ToolCall as ToolCall
from .core.result import Usage as Usage
from .core.sse import ServerSentEvent as ServerSentEvent
from .core.sse import SSEDecoder as SSEDecoder
from .fanout import Fanout as Fanout
from .fanout import FanoutOptions as FanoutOptions
from .fanout import StreamHandle as StreamHandle
from .fanout import StreamSnapshot as StreamSnapshot
from .fanout import open_fanout as open_fanout
from .fanout import run_fanout as run_fanout
from .net.transport import make_client as make_client
from .request import Deadlines as Deadlines
from .request import Endpoint as Endpoint
from .request import RetryPolicy as RetryPolicy
from .request import StreamRequest as StreamRequest

__version__ = "0.1.0.dev0"

__all__ = [
    "CONTENT_EVENTS",
    "Accumulator",
    "Attempt",
    "ChatChunkInterpreter",
    "ChoiceFinished",
    "ChoiceResult",
    "ChoiceRole",
    "Config",
    "ConfigError",
    "ContentEvent",
    "CoreEvent",
    "Deadlines",
    "DoneReceived",
    "Endpoint",
    "ErrorReported",
    "Event",
    "EventChannel",
    "EventTooLarge",
    "Fanout",
    "FanoutError",
    "FanoutOptions",
    "Flag",
    "FrameSkipped",
    "MalformedFrame",
    "ModelConfig",
    "Outcome",
    "ProtocolError",
    "ReasoningDelta",
    "RefusalDelta",
    "ResponseInfo",
    "ResponseTooLarge",
    "RetryPolicy",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamError",
    "StreamFinished",
    "StreamHandle",
    "StreamParser",
    "StreamRequest",
    "StreamResult",
    "StreamRetrying",
    "StreamSnapshot",
    "StreamStarted",
    "TextDelta",
    "ThinkingBlock",
    "ThinkingBlockFinished",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "UsageReported",
    "load_config",
    "make_client",
    "open_fanout",
    "parse_stream",
    "run_fanout",
    "tune_gc",
]
