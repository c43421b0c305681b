"""The shared limit on a Redis server: every shard's process (or pod) names the same URL.

Each limit of a space is two keys, both under the space's hash tag (one cluster slot):
``fanout:{SPACE}:NAME`` a hash (``max``, ``cap``, ``paused``, ``decreased``, ``ok``,
``rate_limited``, ``decreases``) and ``fanout:{SPACE}:NAME:holders`` a sorted set of
holders scored by the time their lease ends.  Every change is one Lua script, atomic on
the server, on the server's clock (``TIME``, in milliseconds): the shards' clocks never
meet.  The scripts do what ``fanout.sharedlimit.table.LimitTable`` does (the tests hold
the two to the same contract).  Keys untouched for a day expire.

redis-py's blocking client runs in worker threads (``trio.to_thread``); each call is
one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import trio

from .base import DEFAULT_LEASE, SharedLimits, SharedLimitUnavailable
from .table import COOLDOWN, MINIMUM, LimitState

try:
    import redis
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("a Redis shared limit needs the redis client: "
                      "pip install 'fanout[redis]'") from exc

__all__ = ["RedisLimits"]

#: Milliseconds a limit's keys outlive their last use.
KEEP_MS = 24 * 3600 * 1000

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the limits' hash then holders, pair after pair.  ARGV: each limit's maximum.
_SETUP = """
for i = 1, #KEYS / 2 do
  local h = KEYS[2 * i - 1]
  local maximum = tonumber(ARGV[i])
  redis.call('HSET', h, 'max', maximum)
  local cap = tonumber(redis.call('HGET', h, 'cap'))
  if not cap or cap > maximum then redis.call('HSET', h, 'cap', maximum) end
  redis.call('PEXPIRE', h, KEEP_MS)
end
return 1
""".replace("KEEP_MS", str(KEEP_MS))

# KEYS: hash, holders, pair after pair.  ARGV: holder, lease (ms).
# -1: granted; 0: a limit is full; n > 0: paused for n ms more.
_ACQUIRE = _NOW + """
local holder, lease = ARGV[1], tonumber(ARGV[2])
local n = #KEYS / 2
local paused = 0
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now)
  local until_ = tonumber(redis.call('HGET', KEYS[2 * i - 1], 'paused') or '0')
  if until_ - now > paused then paused = until_ - now end
end
if paused > 0 then return paused end
for i = 1, n do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  if not redis.call('ZSCORE', z, holder) then
    local cap = tonumber(redis.call('HGET', h, 'cap'))
    if not cap then return redis.error_reply('limit ' .. h .. ' was never set up') end
    if redis.call('ZCARD', z) >= cap then return 0 end
  end
end
for i = 1, n do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  redis.call('ZADD', z, now + lease, holder)
  redis.call('PEXPIRE', z, KEEP_MS)
  redis.call('PEXPIRE', h, KEEP_MS)
end
return -1
""".replace("KEEP_MS", str(KEEP_MS))

# KEYS: holders sets.  ARGV: holders.
_RELEASE = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], unpack(ARGV)) end
return 1
"""

# KEYS: holders sets.  ARGV: lease (ms), then holders.
_RENEW = _NOW + """
local ends = now + tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  for j = 2, #ARGV do redis.call('ZADD', KEYS[i], 'XX', ends, ARGV[j]) end
end
return 1
"""

# KEYS: hash.  ARGV: wait (ms, 0: none), cooldown (ms), minimum.
_RATE_LIMITED = _NOW + """
local h = KEYS[1]
local wait, cooldown, minimum = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('HINCRBY', h, 'rate_limited', 1)
if wait > 0 then
  local until_ = tonumber(redis.call('HGET', h, 'paused') or '0')
  if now + wait > until_ then redis.call('HSET', h, 'paused', now + wait) end
end
local last = tonumber(redis.call('HGET', h, 'decreased'))
if not last or now - last >= cooldown then
  redis.call('HSET', h, 'decreased', now, 'ok', 0)
  local cap = tonumber(redis.call('HGET', h, 'cap'))
  if cap and cap > minimum then
    redis.call('HSET', h, 'cap', math.max(minimum, math.floor(cap / 2)))
    redis.call('HINCRBY', h, 'decreases', 1)
  end
end
return 1
"""

# KEYS: hash.  ARGV: count.
_SUCCEEDED = """
local h = KEYS[1]
local cap = tonumber(redis.call('HGET', h, 'cap'))
local maximum = tonumber(redis.call('HGET', h, 'max'))
if not cap or not maximum then return 0 end
local ok = tonumber(redis.call('HGET', h, 'ok') or '0')
for _ = 1, tonumber(ARGV[1]) do
  if cap >= maximum then break end
  ok = ok + 1
  if ok >= cap then ok = 0; cap = cap + 1 end
end
redis.call('HSET', h, 'cap', cap, 'ok', ok)
return cap
"""

# KEYS: hash, holders.  -> max, cap, held, paused for (ms), rate_limited, decreases.
_STATE = _NOW + """
local h, z = KEYS[1], KEYS[2]
redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
local paused = tonumber(redis.call('HGET', h, 'paused') or '0') - now
if paused < 0 then paused = 0 end
return {tonumber(redis.call('HGET', h, 'max') or '0'),
        tonumber(redis.call('HGET', h, 'cap') or '0'), redis.call('ZCARD', z), paused,
        tonumber(redis.call('HGET', h, 'rate_limited') or '0'),
        tonumber(redis.call('HGET', h, 'decreases') or '0')}
"""

#: Holders per release or renewal call (a script's arguments are unpacked).
_CHUNK = 500


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisLimits(SharedLimits):
    """The limits on the Redis server at ``url`` (``redis://HOST:PORT/DB``, ``rediss://``,
    ``unix://PATH``, as ``redis.Redis.from_url`` takes it); ``shown``: the URL as output
    names it (no password)."""

    def __init__(self, url: str, *, lease: float = DEFAULT_LEASE, shown: str | None = None,
                 prefix: str = "fanout") -> None:
        self.lease = lease
        self.shown = shown or url
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5,
                                           health_check_interval=30)
        self._scripts = {name: self.client.register_script(source) for name, source in (
            ("setup", _SETUP), ("acquire", _ACQUIRE), ("release", _RELEASE),
            ("renew", _RENEW), ("rate_limited", _RATE_LIMITED), ("succeeded", _SUCCEEDED),
            ("state", _STATE))}

    def describe(self) -> str:
        return f"Redis at {self.shown}"

    def check(self) -> None:
        try:
            self.client.ping()
        except redis.RedisError as exc:
            raise SharedLimitUnavailable(f"{self.describe()}: {str(exc).rstrip('.')}") from None

    def key(self, space: str, name: str) -> str:
        """The hash of limit ``name``; its holders are this with ``:holders``."""
        return f"{self.prefix}:{{{space}}}:{name}"

    def _pairs(self, space: str, names: Iterable[str]) -> list[str]:
        keys = []
        for name in names:
            keys += [self.key(space, name), self.key(space, name) + ":holders"]
        return keys

    async def _run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        call = self._scripts[script]
        try:
            return await trio.to_thread.run_sync(
                lambda: call(keys=list(keys), args=list(args)))
        except redis.RedisError as exc:  # gone mid-run: the batch stops sending, says why
            raise SharedLimitUnavailable(
                f"{self.describe()}: {str(exc).rstrip('.')}") from None

    async def setup(self, space: str, maxima: Mapping[str, int]) -> None:
        await self._run("setup", self._pairs(space, maxima), list(maxima.values()))

    async def try_acquire(self, space: str, names: Iterable[str], holder: str,
                          lease: float, wait: float = 0.0) -> float | None:
        answer = int(await self._run("acquire", self._pairs(space, names),
                                     [holder, _ms(lease)]))
        return None if answer < 0 else answer / 1000

    async def release(self, space: str, names: Iterable[str], holders: Iterable[str]) -> None:
        keys = [self.key(space, name) + ":holders" for name in names]
        every = list(holders)
        for start in range(0, len(every), _CHUNK):
            await self._run("release", keys, every[start:start + _CHUNK])

    async def renew(self, space: str, names: Iterable[str], holders: Iterable[str],
                    lease: float) -> None:
        keys = [self.key(space, name) + ":holders" for name in names]
        every = list(holders)
        for start in range(0, len(every), _CHUNK):
            await self._run("renew", keys, [_ms(lease), *every[start:start + _CHUNK]])

    async def rate_limited(self, space: str, name: str, wait: float | None, *,
                           cooldown: float = COOLDOWN, minimum: int = MINIMUM) -> None:
        await self._run("rate_limited", [self.key(space, name)],
                        [_ms(wait) if wait else 0, _ms(cooldown), minimum])

    async def succeeded(self, space: str, name: str, count: int = 1) -> None:
        await self._run("succeeded", [self.key(space, name)], [count])

    async def state(self, space: str, name: str) -> LimitState:
        maximum, cap, held, paused, limited, decreases = await self._run(
            "state", self._pairs(space, [name]), [])
        return LimitState(maximum=int(maximum), cap=int(cap), held=int(held),
                          paused_for=int(paused) / 1000, rate_limited=int(limited),
                          decreases=int(decreases))

    def close(self) -> None:
        self.client.close()
