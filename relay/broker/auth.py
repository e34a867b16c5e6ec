"""AUTH as nsqd (nsqd/client_v2.go, internal/auth): a client's secret is checked by an
auth server (--auth-http-address) or, beyond nsqd, a static file (--auth-file) of the
same replies; the authorizations it gets are kept for their ttl, then asked for again.

Secrets are never logged: the query URL holds one, so errors name only the server.
"""

import json
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from marshmallow import ValidationError

from relay.broker.schemas import AuthReplySchema
from relay.errors import ConfigError, RelayError

REQUEST_TIMEOUT = 5.0
_reply_schema = AuthReplySchema()


class AuthError(RelayError):
    """No auth server answered usably; the text never holds the secret."""


@dataclass
class Authorization:
    topic: str
    channels: list
    permissions: list

    def allows(self, topic: str, channel: str) -> bool:
        """nsqd's IsAllowed: publish when channel is "", else subscribe; the topic regex
        and one channel regex must match (Go's MatchString: anywhere in the name), even
        for publish, where the channel is ""."""
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions or not re.search(self.topic, topic):
            return False
        return any(re.search(c, channel) for c in self.channels)


@dataclass
class Grant:
    """What a secret is allowed, and until when (monotonic seconds)."""
    identity: str
    identity_url: str
    authorizations: list
    expires: float

    def allows(self, topic: str, channel: str) -> bool:
        return any(a.allows(topic, channel) for a in self.authorizations)

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.expires

    def reply(self) -> bytes:
        """nsqd's answer to AUTH."""
        return json.dumps({"identity": self.identity, "identity_url": self.identity_url,
                           "permission_count": len(self.authorizations)},
                          separators=(",", ":")).encode()


class Authorizer:
    def __init__(self, options):
        self.addresses = [a.strip() for a in options.auth_http_address.split(",") if a.strip()]
        self.method = options.auth_http_request_method
        self.static = load_file(options.auth_file) if options.auth_file else None

    @property
    def enabled(self) -> bool:
        return bool(self.addresses) or self.static is not None

    def grant(self, secret: str, remote_ip: str, tls: bool, common_name: str) -> Grant:
        """Ask the auth servers (in random order, as nsqd) or the static file."""
        if self.static is not None and not self.addresses:
            reply = self.static.get(secret, {"ttl": 0, "authorizations": []})
            return grant_of(reply)
        params = {"remote_ip": remote_ip, "tls": "true" if tls else "false",
                  "secret": secret, "common_name": common_name}
        problems = []
        for address in random.sample(self.addresses, len(self.addresses)):
            try:
                return grant_of(_reply_schema.load(self._ask(address, params)))
            except (OSError, ValueError, ValidationError) as e:
                problems.append(f"{address}: {type(e).__name__}")
        raise AuthError("no auth server answered (" + ", ".join(problems) + ")")

    def _ask(self, address: str, params: dict):
        query = urllib.parse.urlencode(params)
        url = f"http://{address}/auth"
        if self.method == "post":
            request = urllib.request.Request(url, data=query.encode(), method="POST")
        else:
            request = urllib.request.Request(f"{url}?{query}")
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
            return json.loads(response.read())


def grant_of(reply: dict) -> Grant:
    """What an auth reply grants, for its ttl from now."""
    return Grant(reply.get("identity", ""), reply.get("identity_url", ""),
                 [Authorization(a["topic"], a["channels"], a["permissions"])
                  for a in reply["authorizations"]],
                 time.monotonic() + reply["ttl"])


def load_file(path: str) -> dict:
    """--auth-file: {secret: the reply an auth server would give}, validated at start."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not an object of secret -> reply")
        return {secret: _reply_schema.load(reply) for secret, reply in data.items()}
    except (OSError, ValueError, ValidationError) as e:
        raise ConfigError(f"auth file {path}: {e}") from None
