"""marshmallow schemas for JSON relay is sent: IDENTIFY, and auth server replies."""

import codecs
import json
import re

from marshmallow import EXCLUDE, Schema, ValidationError, fields, pre_load, validate


class _StrictBool(fields.Boolean):
    """JSON true/false only, as Go's encoding/json decodes into a bool (1 is an error)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise ValidationError("not a boolean")
        return value


def _int(bits: int):
    """An integer that fits Go's intN, else decoding fails as in encoding/json."""
    limit = 2 ** (bits - 1)
    return fields.Integer(strict=True, validate=validate.Range(min=-limit, max=limit - 1))


def _one_byte_replaced(error: UnicodeError) -> tuple[str, int]:
    """U+FFFD for the first byte that is not UTF-8, reading on at the next byte: Go
    replaces each invalid byte (utf8.DecodeRune), where "replace" takes a truncated
    sequence as one."""
    assert isinstance(error, UnicodeDecodeError)
    return "\ufffd", error.start + 1


codecs.register_error("relay-go-replace", _one_byte_replaced)
_SURROGATE = re.compile("[\ud800-\udfff]")


class _GoString(fields.String):
    """A JSON string as Go decodes it: an escaped lone surrogate (json.loads keeps it,
    and it cannot be encoded to UTF-8) becomes U+FFFD."""

    def _deserialize(self, value, attr, data, **kwargs):
        return _SURROGATE.sub("\ufffd", super()._deserialize(value, attr, data, **kwargs))


class IdentifySchema(Schema):
    """identifyDataV2 (nsqd/protocol_v2.go): unknown fields are ignored, types are strict.

    Ranges depend on the broker's options, so Client.identify checks them, in nsqd's order.
    """

    class Meta:
        unknown = EXCLUDE

    client_id = _GoString()
    hostname = _GoString()
    user_agent = _GoString()
    feature_negotiation = _StrictBool()
    heartbeat_interval = _int(64)
    output_buffer_size = _int(64)
    output_buffer_timeout = _int(64)
    tls_v1 = _StrictBool()
    snappy = _StrictBool()
    deflate = _StrictBool()
    deflate_level = _int(64)
    sample_rate = _int(32)
    msg_timeout = _int(64)
    relay_dedup = _StrictBool()     # relay's: publish keys (relay/broker/protocol/keyed.py)
    relay_order = _StrictBool()     # relay's: order keys (the same)

    @pre_load
    def like_go(self, data, **kwargs):
        """Go matches keys case-insensitively and leaves a field unset for null."""
        if not isinstance(data, dict):
            raise ValidationError("not an object")
        return {k.lower(): v for k, v in data.items() if v is not None}


_IDENTIFY = IdentifySchema()


def load_identify(body: bytes) -> dict:
    """IDENTIFY's body as nsqd's json.Unmarshal reads it: UTF-8 with each invalid byte
    taken as U+FFFD (a client on a host whose name is not UTF-8 can connect), and no BOM
    nor UTF-16 (which json.loads of bytes takes). Raises ValueError or ValidationError."""
    data = json.loads(body.decode("utf-8", "relay-go-replace"))
    return _IDENTIFY.load({} if data is None else data)


def _regex(value: str) -> None:
    try:
        re.compile(value)
    except re.error as e:
        raise ValidationError(f"not a regular expression: {e}") from None


class AuthorizationSchema(Schema):
    """One grant of an auth server's reply (nsqd internal/auth.Authorization)."""

    class Meta:
        unknown = EXCLUDE

    topic = fields.String(required=True, validate=_regex)
    channels = fields.List(fields.String(validate=_regex), required=True)
    permissions = fields.List(fields.String(), required=True)


class AuthReplySchema(Schema):
    """An auth server's reply to /auth, or one entry of --auth-file (nsqd auth.State)."""

    class Meta:
        unknown = EXCLUDE

    ttl = fields.Integer(required=True, validate=validate.Range(min=0))
    identity = fields.String(load_default="")
    identity_url = fields.String(load_default="")
    authorizations = fields.List(fields.Nested(AuthorizationSchema), required=True)
