"""Limits shared by the shards of one batch: the endpoint's concurrency, each model's,
and the 429 back-off, held where every shard sees them.

Without one, each shard takes a static share (``fanout.batch.runner``).  With one, every
stream takes a slot of the endpoint's limit and of its model's before it is sent, under
a lease that its shard renews while the stream runs (a killed shard's slots come back
when their leases run out); a 429 any shard sees pauses the model for every shard and
halves its cap, and completed streams grow it back (``fanout.ratelimit``'s rules).

- ``SharedLimits``: the interface; ``LocalLimits``: in one trio program;
  ``fanout.sharedlimit.redis.RedisLimits``: on a Redis server (processes, pods);
  ``fanout.sharedlimit.ray.RayLimits``: in a named Ray actor (Ray tasks).
- ``open_shared_limits(spec)``: the one a spec names (``redis://...``, ``ray://``).
- ``SharedSlots``: one batch's slots, leases and reports (what the session uses).
- ``LimitTable``: the rules as plain state, no I/O (the actor's and ``LocalLimits``').
"""

from .base import DEFAULT_LEASE as DEFAULT_LEASE
from .base import LocalLimits as LocalLimits
from .base import SharedLimits as SharedLimits
from .base import SharedLimitUnavailable as SharedLimitUnavailable
from .base import shown_spec as shown_spec
from .base import spec_problem as spec_problem
from .opener import open_shared_limits as open_shared_limits
from .slots import SharedSlots as SharedSlots
from .table import LimitState as LimitState
from .table import LimitTable as LimitTable

__all__ = ["DEFAULT_LEASE", "LimitState", "LimitTable", "LocalLimits", "SharedLimitUnavailable",
           "SharedLimits", "SharedSlots", "open_shared_limits", "shown_spec", "spec_problem"]
