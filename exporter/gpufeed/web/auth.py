"""Basic auth and the request rate limit of the web config, as one aiohttp middleware that
runs before every handler (every endpoint, unknown paths included, as in the toolkit).

bcrypt is slow on purpose (about 70 ms at cost 10): it runs in a thread, one check at a
time, so that a flood of wrong passwords cannot take the event loop, and each verdict is
remembered (under a digest, not the password) so that a scraper pays it once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from gpufeed.web.webconfig import RateLimit

# A bcrypt hash of a password nobody has: an unknown user costs as much as a known one,
# so that response times do not tell which users exist (as in the toolkit).
# (bcrypt of "no user has this password", cost 10: the cost of a typical configured hash)
_DECOY_HASH = b"$2b$10$RnFrxbr.PB8vXmSkD6TTq.adHicBE18TNq8BJrt1te4T299EFBb3y"
_MAX_VERDICTS = 100


class TokenBucket:
    """`burst` requests at once, then one per `interval_seconds` (the toolkit's rate_limit)."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = limit.interval_seconds
        self._burst = float(limit.burst)
        self._tokens = float(limit.burst)
        self._clock = clock
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class BasicAuth:
    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()
        self._one_at_a_time = asyncio.Lock()

    async def allows(self, authorization: str) -> bool:
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join([user.encode(), hashed or b"", password.encode()])).digest()
        verdict = self._verdicts.get(key)
        if verdict is None:
            # imported here: only an agent with basic auth configured needs bcrypt (a GPU
            # host's own Python, without it, runs the agent for the lab)
            import bcrypt

            async with self._one_at_a_time:
                ok = await asyncio.to_thread(
                    bcrypt.checkpw, password.encode(), hashed or _DECOY_HASH
                )
            verdict = ok and hashed is not None
            self._verdicts[key] = verdict
            if len(self._verdicts) > _MAX_VERDICTS:
                self._verdicts.popitem(last=False)
        return verdict


def _basic_credentials(authorization: str) -> tuple[str, str] | None:
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def access_middleware(
    users: Mapping[str, bytes], rate_limit: RateLimit | None
) -> Middleware | None:
    """The middleware for the web config's users and rate limit; None when it has neither."""
    if not users and rate_limit is None:
        return None
    auth = BasicAuth(users) if users else None
    bucket = TokenBucket(rate_limit) if rate_limit is not None else None

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if bucket is not None and not bucket.allow():
            return web.Response(status=429, text="429 Too Many Requests\n")
        if auth is not None and not await auth.allows(request.headers.get(hdrs.AUTHORIZATION, "")):
            return web.Response(
                status=401,
                text="401 Unauthorized\n",
                headers={hdrs.WWW_AUTHENTICATE: "Basic"},
            )
        return await handler(request)

    return access
