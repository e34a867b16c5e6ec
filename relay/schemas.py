"""marshmallow schemas for what clients send as JSON (IDENTIFY)."""

from marshmallow import EXCLUDE, Schema, fields


class _StrictBool(fields.Boolean):
    """JSON true/false only, as Go's encoding/json decodes into a bool."""

    truthy = {True}
    falsy = {False}


class IdentifySchema(Schema):
    """identifyDataV2 (nsqd/protocol_v2.go): unknown fields are ignored, types are strict.

    Ranges depend on the broker's options, so Client.identify checks them, in nsqd's order.
    """

    class Meta:
        unknown = EXCLUDE

    client_id = fields.String()
    hostname = fields.String()
    user_agent = fields.String()
    feature_negotiation = _StrictBool()
    heartbeat_interval = fields.Integer(strict=True)
    output_buffer_size = fields.Integer(strict=True)
    output_buffer_timeout = fields.Integer(strict=True)
    tls_v1 = _StrictBool()
    snappy = _StrictBool()
    deflate = _StrictBool()
    deflate_level = fields.Integer(strict=True)
    sample_rate = fields.Integer(strict=True)
    msg_timeout = fields.Integer(strict=True)
