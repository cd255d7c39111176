"""Request bodies in Kubernetes' protobuf encoding, read as the JSON objects they stand for.

kubectl's typed clients (``kubectl create secret generic``, ``create configmap``, ``create namespace``) POST
``application/vnd.kubernetes.protobuf``: the 4-byte magic ``k8s\\0`` then a ``runtime.Unknown`` whose ``raw``
is the object's generated proto (k8s.io/api/core/v1/generated.proto). There is no maintained Python package
of those generated messages, so the few kinds those commands send are declared here, field numbers as in
generated.proto, and decoded with the protobuf runtime. Fields left out of a declaration are skipped.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BYTES, _BOOL, _INT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_BOOL, _F.TYPE_INT64, _F.TYPE_MESSAGE
_MAPS = {"map<string,string>": _STRING, "map<string,bytes>": _BYTES}

# message -> (field name, number, type or "map<...>" or message name, repeated)
_MESSAGES: dict[str, list[tuple[str, int, Any, bool]]] = {
    "TypeMeta": [("apiVersion", 1, _STRING, False), ("kind", 2, _STRING, False)],
    "Unknown": [
        ("typeMeta", 1, "TypeMeta", False),
        ("raw", 2, _BYTES, False),
        ("contentEncoding", 3, _STRING, False),
        ("contentType", 4, _STRING, False),
    ],
    "ObjectMeta": [
        ("name", 1, _STRING, False),
        ("generateName", 2, _STRING, False),
        ("namespace", 3, _STRING, False),
        ("labels", 11, "map<string,string>", False),
        ("annotations", 12, "map<string,string>", False),
        ("finalizers", 14, _STRING, True),
    ],
    "Secret": [
        ("metadata", 1, "ObjectMeta", False),
        ("data", 2, "map<string,bytes>", False),
        ("type", 3, _STRING, False),
        ("stringData", 4, "map<string,string>", False),
        ("immutable", 5, _BOOL, False),
    ],
    "ConfigMap": [
        ("metadata", 1, "ObjectMeta", False),
        ("data", 2, "map<string,string>", False),
        ("binaryData", 3, "map<string,bytes>", False),
        ("immutable", 4, _BOOL, False),
    ],
    "NamespaceSpec": [("finalizers", 1, _STRING, True)],
    "Namespace": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "NamespaceSpec", False)],
    "LocalObjectReference": [("name", 1, _STRING, False)],
    "ServiceAccount": [
        ("metadata", 1, "ObjectMeta", False),
        ("imagePullSecrets", 3, "LocalObjectReference", True),
        ("automountServiceAccountToken", 4, _BOOL, False),
    ],
}
_PACKAGE = "tpuflow.standin.k8s"


def _build() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="tpuflow_standin_k8s.proto", package=_PACKAGE, syntax="proto2")
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(name=field_name, number=number, json_name=field_name)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if kind in _MAPS:
                entry = message.nested_type.add(name=f"{field_name[0].upper()}{field_name[1:]}Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_STRING, label=_F.LABEL_OPTIONAL)
                entry.field.add(name="value", number=2, type=_MAPS[kind], label=_F.LABEL_OPTIONAL)
                field.label, field.type = _F.LABEL_REPEATED, _MESSAGE
                field.type_name = f".{_PACKAGE}.{name}.{entry.name}"
            elif isinstance(kind, str):
                field.type, field.type_name = _MESSAGE, f".{_PACKAGE}.{kind}"
            else:
                field.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in _MESSAGES
    }


_CLASSES = _build()


class ProtobufBodyError(ValueError):
    """A protobuf body the stand-in cannot read (not the envelope, or a kind it does not declare)."""


def decode(raw: bytes) -> dict[str, Any]:
    """The JSON object a protobuf request body encodes (bytes fields base64, as the JSON form has them)."""
    if not raw.startswith(MAGIC):
        raise ProtobufBodyError("the body does not start with the k8s protobuf magic")
    envelope = _CLASSES["Unknown"]()
    envelope.ParseFromString(raw[len(MAGIC) :])
    kind = envelope.typeMeta.kind
    if kind not in ("Secret", "ConfigMap", "Namespace", "ServiceAccount"):
        raise ProtobufBodyError(
            f"the stand-in reads protobuf bodies of Secret, ConfigMap, Namespace and ServiceAccount, not {kind!r}"
        )
    obj = _CLASSES[kind]()
    obj.ParseFromString(envelope.raw)
    body = json_format.MessageToDict(obj, preserving_proto_field_name=True)
    return {"apiVersion": envelope.typeMeta.apiVersion, "kind": kind, **_drop_empty(body)}


_MAP_FIELDS = {name for fields in _MESSAGES.values() for name, _, kind, _ in fields if kind in _MAPS}


def _drop_empty(value: Any) -> Any:
    """Go's generated marshaller writes every optional string; JSON's omitempty leaves empty ones out.

    Map values (a Secret key holding "") are data and stay.
    """
    if isinstance(value, dict):
        return {k: v if k in _MAP_FIELDS else _drop_empty(v) for k, v in value.items() if v not in ("", None, {}, [])}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value
