"""An AsyncAPI 3.0 document of qbroker units: what ``qbroker asyncapi`` writes.

Input is what a unit says about itself: ``Unit.describe()`` as discovery (``qbroker.ping``) returns it,
or ``describe_code(unit)`` for an app's code, which adds the listeners' and results' schemas. Each RPC
endpoint is a channel on the ``rpc`` topic exchange (routing key = name) with a receive operation whose
reply goes to the caller's ``reply`` queue; each alert pattern a channel on ``alert``. Payload schemas are
the handlers' pydantic models; the AMQP headers (the envelope of docs/wire-format.md) and the error
element are shared components. Bindings are AMQP 0-9-1 (binding version 0.3.0).
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

from qbroker.config import Config
from qbroker.envelope import PROTOCOL_VERSION
from qbroker.errors import ErrorInfo
from qbroker.handlers import Handler
from qbroker.unit import Unit

ASYNCAPI_VERSION = "3.0.0"
BINDING_VERSION = "0.3.0"
REF = "#/components/"
# Listeners every unit has: the discovery ping is documented once, broadcasts are their endpoint's.
BROADCAST_PREFIX = "qbroker.broadcast."


def _id(name: str) -> str:
    """An AsyncAPI key (``^[\\w\\d.\\-_]+$``) for an endpoint name or a topic pattern."""
    return re.sub(r"[^\w.\-]", "_", name.replace("#", "hash").replace("*", "star"))


MAX_SCHEMA_DEPTH = 64  # deeper is no pydantic model's; copying and rewriting it would recurse without end


def _schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot go into a document (not an object, too deep, a ``$ref`` to no ``$defs`` entry)."""
    if not isinstance(schema, dict):
        return "a schema is not an object"
    defs = schema.get("$defs", {})
    if not isinstance(defs, dict) or not all(isinstance(d, dict) for d in defs.values()):
        return "$defs is not an object of schemas"
    pending: list[tuple[Any, int]] = [(schema, 0)]  # walked without recursion: the depth is the wire's
    while pending:
        node, depth = pending.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return f"a schema nests deeper than {MAX_SCHEMA_DEPTH}"
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[len("#/$defs/") :] not in defs:
                return f"$ref {ref[:100]!r} names no $defs entry"
            pending.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            pending.extend((value, depth + 1) for value in node)
    return None


def _endpoint_problem(described: Any) -> str | None:
    if not isinstance(described, dict):
        return "not an object"
    commands = described.get("commands") or {}
    if not isinstance(commands, dict):
        return "commands is not an object"
    for command, schema in commands.items():
        required = schema.get("required", []) if isinstance(schema, dict) else None
        if (
            not isinstance(schema, dict)
            or not isinstance(schema.get("properties", {}), dict)
            or not isinstance(required, list)
            or not all(isinstance(r, str) for r in required)
        ):
            return f"command {command[:100]!r}: not an object schema"
    for schema in (described.get("schema"), described.get("result"), *commands.values()):
        if schema and (problem := _schema_problem(schema)):
            return problem
    return None


def description_problem(unit: Any) -> str | None:
    """Why a unit's description (a ``qbroker.ping`` answer: anyone's words) cannot be documented, or None."""
    if not isinstance(unit, dict):
        return "not an object"
    endpoints = unit.get("endpoints") or {}
    if not isinstance(endpoints, dict):
        return "endpoints is not an object"
    for name, described in endpoints.items():
        if problem := _endpoint_problem(described):
            return f"endpoint {name[:100]!r}: {problem}"
    listeners, alerts = unit.get("listeners") or [], unit.get("alerts") or {}
    if not isinstance(listeners, list) or not all(isinstance(pattern, str) for pattern in listeners):
        return "listeners is not a list of names"
    if not isinstance(alerts, dict):
        return "alerts is not an object"
    for pattern, schema in alerts.items():
        if problem := _schema_problem(schema):
            return f"alert {pattern[:100]!r}: {problem}"
    return None


def describe_code(unit: Unit) -> dict[str, Any]:
    """``unit.describe()`` plus what only the code knows: listener and result schemas."""
    described = unit.describe()
    described["alerts"] = {
        listener.pattern: listener.handler.json_schema()
        for listener in unit.listeners
        if isinstance(listener.handler, Handler)
    }
    for name, endpoint in unit.endpoints.items():
        if endpoint.handler is not None:
            described["endpoints"][name]["result"] = endpoint.handler.result_schema()
    return described


class _Schemas:
    """components.schemas, with each model's ``$defs`` hoisted there and its ``$ref``s rewritten."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def add(self, prefix: str, schema: dict[str, Any]) -> dict[str, Any]:
        schema = copy.deepcopy(schema)
        defs = schema.pop("$defs", {})
        renamed = {name: f"{prefix}.{_id(name)}" for name in defs}
        for name, sub in defs.items():
            self.schemas[renamed[name]] = self._rewrite(sub, renamed)
        return self._rewrite(schema, renamed)  # type: ignore[no-any-return]

    @staticmethod
    def rename_refs(node: Any, renamed: dict[str, str]) -> Any:
        """``node`` with its ``#/$defs/<name>`` references to the names in ``renamed`` renamed (others kept)."""
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[len("#/$defs/") :] in renamed:
                return {**node, "$ref": "#/$defs/" + renamed[ref[len("#/$defs/") :]]}
            return {key: _Schemas.rename_refs(value, renamed) for key, value in node.items()}
        if isinstance(node, list):
            return [_Schemas.rename_refs(item, renamed) for item in node]
        return node

    def _rewrite(self, node: Any, renamed: dict[str, str]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return {**node, "$ref": REF + "schemas/" + renamed[ref[len("#/$defs/") :]]}
            return {key: self._rewrite(value, renamed) for key, value in node.items()}
        if isinstance(node, list):
            return [self._rewrite(item, renamed) for item in node]
        return node


def _headers_schema(reply: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "version": {"type": "integer", "const": PROTOCOL_VERSION, "description": "QBroker protocol version"},
        "app": {"type": "string", "description": "the sending unit's app name"},
        "debug": {"type": "boolean", "description": "ask for tracebacks in error elements"},
        "traceparent": {"type": "string", "description": "W3C trace context (qbroker.tracing); optional"},
    }
    if reply:
        properties["error"] = {"$ref": REF + "schemas/ErrorElement"}
        properties["notice"] = {
            "type": "string",
            "enum": ["delivered"],
            "description": "not the reply: the request reached a server",
        }
    else:
        properties["name"] = {"type": "string", "description": "the endpoint or alert name"}
        properties["deadline"] = {"type": "integer", "description": "epoch milliseconds the caller waits until"}
        properties["notify"] = {
            "type": "string",
            "enum": ["delivered"],
            "description": "ask for a delivered notice before the reply",
        }
        properties["error"] = {
            "$ref": REF + "schemas/ErrorElement",
            "description": "an alert's error state (status ok: it is over)",
        }
    return {"type": "object", "required": ["version"], "properties": properties}


def _exchange(config: Config, role: Literal["rpc", "reply", "alert"], kind: str, vhost: str) -> dict[str, Any]:
    return {"name": config.exchange_name(role), "type": kind, "durable": True, "autoDelete": False, "vhost": vhost}


def _topic_channel(
    address: str, title: str, description: str, message: str, message_id: str, exchange: dict[str, Any]
) -> dict[str, Any]:
    """A channel whose address is a routing key (or a topic pattern) on ``exchange``."""
    return {
        "address": address,
        "title": title,
        "description": description,
        "messages": {message: {"$ref": REF + f"messages/{message_id}"}},
        "bindings": {"amqp": {"is": "routingKey", "exchange": exchange, "bindingVersion": BINDING_VERSION}},
    }


def _payload(described: dict[str, Any]) -> dict[str, Any]:
    commands = described.get("commands")
    if not commands:
        return dict(described.get("schema") or {})
    # A command endpoint: one object per command, told apart by ``command``. Each command's nested models
    # (its ``$defs``) go up to the payload's, where ``_Schemas.add`` hoists them; a name two commands give
    # different models is told apart by the command's.
    variants = []
    defs: dict[str, Any] = {}
    for command, schema in sorted(commands.items()):
        variant = copy.deepcopy(schema)
        renamed = {}
        for name, sub in variant.pop("$defs", {}).items():
            unique = name if defs.get(name, sub) == sub else f"{name}.{command}"
            defs[unique] = sub
            renamed[name] = unique
        variant = _Schemas.rename_refs(variant, renamed)
        defs.update({unique: _Schemas.rename_refs(defs[unique], renamed) for unique in renamed.values()})
        variant.setdefault("type", "object")
        variant.setdefault("properties", {})["command"] = {"const": command}
        variant["required"] = sorted({"command", *variant.get("required", [])})
        variant.pop("additionalProperties", None)
        variants.append(variant)
    return {"oneOf": variants, **({"$defs": defs} if defs else {})}


def document(
    units: list[dict[str, Any]], *, config: Config | None = None, title: str = "qbroker bus", version: str = "1.0.0"
) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``units`` (``describe()``/``describe_code()`` dicts)."""
    config = config or Config()
    url = urlsplit(config.urls[0])  # the host only: credentials never go into a document
    vhost = unquote(url.path[1:]) if len(url.path) > 1 else "/"
    schemas = _Schemas()
    schemas.schemas["ErrorElement"] = ErrorInfo.model_json_schema()
    schemas.schemas["RequestHeaders"] = _headers_schema(reply=False)
    schemas.schemas["ReplyHeaders"] = _headers_schema(reply=True)
    messages: dict[str, Any] = {
        "error": {
            "name": "error",
            "title": "an error reply",
            "contentType": "application/json",
            "summary": "Any request may be answered with an empty body and the error element in the headers.",
            "headers": {"$ref": REF + "schemas/ReplyHeaders"},
            "payload": {"type": "null"},
            "bindings": {"amqp": {"messageType": "reply", "bindingVersion": BINDING_VERSION}},
        }
    }
    channels: dict[str, Any] = {
        "reply": {
            "address": "{uuid}",
            "title": "a caller's reply queue (reply_<uuid>)",
            "parameters": {"uuid": {"description": "the calling unit's uuid (its reply-to)"}},
            "messages": {"error": {"$ref": REF + "messages/error"}},
            "bindings": {
                "amqp": {
                    "is": "routingKey",
                    "exchange": _exchange(config, "reply", "direct", vhost),
                    "bindingVersion": BINDING_VERSION,
                }
            },
        }
    }
    operations: dict[str, Any] = {}
    endpoints: dict[str, tuple[dict[str, Any], list[str]]] = {}
    alerts: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for unit in units:
        app = str(unit.get("app", ""))
        for name, described in sorted((unit.get("endpoints") or {}).items()):
            endpoints.setdefault(name, (described, []))[1].append(app)
        known = unit.get("alerts") or {}
        for pattern in unit.get("listeners") or []:
            if not pattern.startswith(BROADCAST_PREFIX):
                alerts.setdefault(pattern, (known.get(pattern, {}), []))[1].append(app)
    for name, (described, apps) in sorted(endpoints.items()):
        key = _id(name)
        served_by = ", ".join(sorted(set(apps)))
        messages[f"{key}.request"] = {
            "name": f"{key}.request",
            "title": f"request {name}",
            "contentType": "application/json",
            "headers": {"$ref": REF + "schemas/RequestHeaders"},
            "payload": schemas.add(f"{key}.request", _payload(described)),
            "bindings": {"amqp": {"messageType": "rpc", "bindingVersion": BINDING_VERSION}},
        }
        messages[f"{key}.reply"] = {
            "name": f"{key}.reply",
            "title": f"reply of {name}",
            "contentType": "application/json",
            "headers": {"$ref": REF + "schemas/ReplyHeaders"},
            "payload": schemas.add(f"{key}.reply", described.get("result") or {}),
            "bindings": {"amqp": {"messageType": "reply", "bindingVersion": BINDING_VERSION}},
        }
        channels["reply"]["messages"][f"{key}.reply"] = {"$ref": REF + f"messages/{key}.reply"}
        channels[f"rpc.{key}"] = _topic_channel(
            name,
            f"requests to {name}",
            f"served by {served_by}",
            "request",
            f"{key}.request",
            _exchange(config, "rpc", "topic", vhost),
        )
        operations[f"serve.{key}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/rpc.{key}"},
            "summary": f"{served_by} answer{'s' if len(set(apps)) == 1 else ''} {name}",
            "messages": [{"$ref": f"#/channels/rpc.{key}/messages/request"}],
            "bindings": {"amqp": {"ack": True, "bindingVersion": BINDING_VERSION}},
            "reply": {
                "channel": {"$ref": "#/channels/reply"},
                "address": {"location": "$message.header#/reply_to"},
                "messages": [
                    {"$ref": f"#/channels/reply/messages/{key}.reply"},
                    {"$ref": "#/channels/reply/messages/error"},
                ],
            },
        }
    for pattern, (schema, apps) in sorted(alerts.items()):
        key = _id(pattern)
        messages[f"{key}.alert"] = {
            "name": f"{key}.alert",
            "title": f"alert {pattern}",
            "contentType": "application/json",
            "headers": {"$ref": REF + "schemas/RequestHeaders"},
            "payload": schemas.add(f"{key}.alert", schema),
            "bindings": {"amqp": {"messageType": "alert", "bindingVersion": BINDING_VERSION}},
        }
        channels[f"alert.{key}"] = _topic_channel(
            pattern,
            f"alerts matching {pattern}",
            "a topic pattern on the alert exchange ('*' one word, '#' any number)",
            "alert",
            f"{key}.alert",
            _exchange(config, "alert", "topic", vhost),
        )
        operations[f"listen.{key}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/alert.{key}"},
            "summary": f"{', '.join(sorted(set(apps)))} listen{'s' if len(set(apps)) == 1 else ''} to {pattern}",
            "messages": [{"$ref": f"#/channels/alert.{key}/messages/alert"}],
        }
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": "QBroker AMQP structure: RPC on the rpc exchange with replies to reply_<uuid>, "
            "alerts on the alert exchange, undeliverable requests to dead.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "rabbitmq": {
                "host": url.hostname and f"{url.hostname}:{url.port or 5672}" or "localhost:5672",
                "protocol": "amqps" if url.scheme == "amqps" else "amqp",
                "protocolVersion": "0.9.1",
                "pathname": "/" + quote(vhost, safe=""),
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas.schemas, "messages": messages},
    }
