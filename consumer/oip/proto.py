"""The Open Inference Protocol in protobuf: ``inference.ModelInferRequest`` in, ``inference.ModelInferResponse`` out.

The messages are KServe's ``grpc_predict_v2.proto`` (package ``inference``; Triton's ``grpc_service.proto`` carries
the same messages with the same field numbers), declared here as a descriptor in its own descriptor pool rather
than compiled by ``protoc``: the ``protobuf`` runtime builds the classes, nothing is generated at build time, and a
process that also imports Triton's or MLServer's compiled ``inference`` package sees no clash. The wire format is
the published one; ``tests/unit/test_proto.py`` checks every field's number and type against ``tritonclient``'s
compiled messages and round-trips requests and responses through them.

A record is protobuf when it carries header ``seldon-infer-type: proto/InferModelRequest`` (Seldon Core v2's
Kafka header) or ``content-type: application/x-protobuf``. Such a request is transcoded to the binary data
extension (:mod:`consumer.oip.wire`: a JSON head and raw little-endian tensor bytes) and goes through the same
validation as JSON, so it gets the same dead-letter reasons; its answer is a ``ModelInferResponse`` with
``raw_output_contents`` (little-endian, row-major; BYTES as 4-byte length + bytes), headers
``content-type: application/x-protobuf`` and ``seldon-infer-type: proto/InferModelResponse``.

Request fields used: ``id``; ``inputs`` (``name``, ``datatype``, ``shape`` and either ``contents``, the typed field
of the datatype: ``bool_contents`` BOOL, ``int_contents`` INT8/16/32, ``int64_contents`` INT64, ``uint_contents``
UINT8/16/32, ``uint64_contents`` UINT64, ``fp32_contents`` FP32, ``fp64_contents`` FP64, ``bytes_contents`` BYTES;
or ``raw_input_contents``, one entry per input, for every input); ``outputs`` (names). ``model_name``,
``model_version`` and ``parameters`` are ignored, as the JSON path ignores them (the topic names the model).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError as ProtobufDecodeError

from consumer.errors import DeadLetterReason as R
from consumer.errors import DecodeError, ValidationError
from consumer.oip.wire import Headers

#: Seldon Core v2's header naming a Kafka record's payload type, and its protobuf values.
SELDON_TYPE_HEADER = "seldon-infer-type"
PROTO_REQUEST = b"proto/InferModelRequest"
PROTO_RESPONSE = b"proto/InferModelResponse"
#: The content type of a protobuf record.
CONTENT_TYPE_HEADER = "content-type"
PROTOBUF = b"application/x-protobuf"

_F = descriptor_pb2.FieldDescriptorProto
_REPEATED, _OPTIONAL = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL

#: The typed ``InferTensorContents`` field of each OIP datatype, and its numpy dtype (FP16 and BF16 have none: raw
#: only).
TYPED_CONTENTS: dict[str, tuple[str, str]] = {
    "BOOL": ("bool_contents", "|b1"),
    "INT8": ("int_contents", "<i1"),
    "INT16": ("int_contents", "<i2"),
    "INT32": ("int_contents", "<i4"),
    "INT64": ("int64_contents", "<i8"),
    "UINT8": ("uint_contents", "<u1"),
    "UINT16": ("uint_contents", "<u2"),
    "UINT32": ("uint_contents", "<u4"),
    "UINT64": ("uint64_contents", "<u8"),
    "FP32": ("fp32_contents", "<f4"),
    "FP64": ("fp64_contents", "<f8"),
    "BYTES": ("bytes_contents", "O"),
}
_CONTENT_FIELDS = sorted({field for field, _ in TYPED_CONTENTS.values()})


def _field(name: str, number: int, kind: Any, label: Any = _OPTIONAL, type_name: str = "") -> Any:
    """One field's descriptor (``kind``, ``label``: FieldDescriptorProto's Type and Label values)."""
    field = _F(name=name, number=number, type=kind, label=label)
    if type_name:  # a message field's type, fully qualified
        field.type_name = type_name
    return field


def _message(name: str, fields: Sequence[Any], nested: Sequence[descriptor_pb2.DescriptorProto] = ()) -> Any:
    message = descriptor_pb2.DescriptorProto(name=name)
    message.field.extend(fields)
    message.nested_type.extend(nested)
    return message


def _parameters(number: int, scope: str) -> tuple[Any, Any]:
    """A ``map<string, InferParameter> parameters = number`` field of the message ``scope``, and its map entry."""
    entry = _message(
        "ParametersEntry",
        [_field("key", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_MESSAGE, type_name=".inference.InferParameter")],
    )
    entry.options.map_entry = True
    return _field("parameters", number, _F.TYPE_MESSAGE, _REPEATED, f"{scope}.ParametersEntry"), entry


def _tensor(name: str, scope: str) -> Any:
    """``InferInputTensor`` / ``InferOutputTensor``: name 1, datatype 2, shape 3, parameters 4, contents 5."""
    parameters, entry = _parameters(4, f"{scope}.{name}")
    fields = [
        _field("name", 1, _F.TYPE_STRING),
        _field("datatype", 2, _F.TYPE_STRING),
        _field("shape", 3, _F.TYPE_INT64, _REPEATED),
        parameters,
        _field("contents", 5, _F.TYPE_MESSAGE, type_name=".inference.InferTensorContents"),
    ]
    return _message(name, fields, [entry])


#: InferParameter's oneof ``parameter_choice``, and InferTensorContents' repeated fields, numbered from 1.
_PARAMETER_FIELDS = (("bool_param", _F.TYPE_BOOL), ("int64_param", _F.TYPE_INT64), ("string_param", _F.TYPE_STRING),
                     ("double_param", _F.TYPE_DOUBLE), ("uint64_param", _F.TYPE_UINT64))  # fmt: skip
_CONTENTS_FIELDS = (("bool_contents", _F.TYPE_BOOL), ("int_contents", _F.TYPE_INT32), ("int64_contents", _F.TYPE_INT64),
                    ("uint_contents", _F.TYPE_UINT32), ("uint64_contents", _F.TYPE_UINT64),
                    ("fp32_contents", _F.TYPE_FLOAT), ("fp64_contents", _F.TYPE_DOUBLE),
                    ("bytes_contents", _F.TYPE_BYTES))  # fmt: skip


def _file() -> Any:
    """The part of ``grpc_predict_v2.proto`` streaminfer reads and writes (field numbers as published)."""
    f = descriptor_pb2.FileDescriptorProto(name="streaminfer/grpc_predict_v2.proto", package="inference")
    f.syntax = "proto3"
    parameter = _message("InferParameter", [_field(n, i, k) for i, (n, k) in enumerate(_PARAMETER_FIELDS, 1)])
    parameter.oneof_decl.add(name="parameter_choice")
    for field in parameter.field:
        field.oneof_index = 0
    contents = _message(
        "InferTensorContents", [_field(n, i, k, _REPEATED) for i, (n, k) in enumerate(_CONTENTS_FIELDS, 1)]
    )

    def head(scope: str) -> tuple[list[Any], Any]:
        """Fields 1-4 of both messages (model_name, model_version, id, parameters) and the parameters' map entry."""
        parameters, entry = _parameters(4, scope)
        names = [_field(name, i, _F.TYPE_STRING) for i, name in enumerate(("model_name", "model_version", "id"), 1)]
        return [*names, parameters], entry

    scope = ".inference.ModelInferRequest"
    fields, entry = head(scope)
    out_parameters, out_entry = _parameters(2, f"{scope}.InferRequestedOutputTensor")
    requested = _message("InferRequestedOutputTensor", [_field("name", 1, _F.TYPE_STRING), out_parameters], [out_entry])
    request = _message(
        "ModelInferRequest",
        [
            *fields,
            _field("inputs", 5, _F.TYPE_MESSAGE, _REPEATED, f"{scope}.InferInputTensor"),
            _field("outputs", 6, _F.TYPE_MESSAGE, _REPEATED, f"{scope}.InferRequestedOutputTensor"),
            _field("raw_input_contents", 7, _F.TYPE_BYTES, _REPEATED),
        ],
        [entry, _tensor("InferInputTensor", scope), requested],
    )
    scope = ".inference.ModelInferResponse"
    fields, entry = head(scope)
    response = _message(
        "ModelInferResponse",
        [
            *fields,
            _field("outputs", 5, _F.TYPE_MESSAGE, _REPEATED, f"{scope}.InferOutputTensor"),
            _field("raw_output_contents", 6, _F.TYPE_BYTES, _REPEATED),
        ],
        [entry, _tensor("InferOutputTensor", scope)],
    )
    f.message_type.extend([parameter, contents, request, response])
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
#: ``inference.ModelInferRequest`` (protobuf message class).
ModelInferRequest: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("inference.ModelInferRequest"))
#: ``inference.ModelInferResponse`` (protobuf message class).
ModelInferResponse: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("inference.ModelInferResponse"))


def is_protobuf(headers: Headers) -> bool:
    """Whether a record says it holds a protobuf ``ModelInferRequest`` (either header; names in any case)."""
    for name, value in headers:
        lowered = name.lower()
        if (lowered == SELDON_TYPE_HEADER and value == PROTO_REQUEST) or (
            lowered == CONTENT_TYPE_HEADER and value is not None and value.split(b";")[0].strip() == PROTOBUF
        ):
            return True
    return False


def _typed_bytes(index: int, tensor: Any, datatype: str) -> bytes:
    """One input's ``contents`` as the binary data extension's bytes (little-endian; BYTES length-prefixed).

    Raises:
        ValidationError: datatype_mismatch (another contents field is set, or the datatype has no typed field);
            out_of_range (a value does not fit the datatype).
    """
    set_fields = [f for f in _CONTENT_FIELDS if len(getattr(tensor.contents, f))]
    typed = TYPED_CONTENTS.get(datatype)
    name = tensor.name
    if typed is None:
        if datatype in ("FP16", "BF16"):
            raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: {datatype} travels in raw_input_contents only")
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: unknown datatype {datatype!r}")
    field, dtype = typed
    wrong = [f for f in set_fields if f != field]
    if wrong:
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: {datatype} data in contents.{wrong[0]}, expected {field}"
        )
    values = getattr(tensor.contents, field)
    if dtype == "O":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    wide = np.asarray(values, dtype=np.int64 if dtype[1] == "i" else np.uint64 if dtype[1] == "u" else None)
    target = np.dtype(dtype)
    if target.kind in "iu" and wide.size:
        info = np.iinfo(target)
        if wide.min() < info.min or wide.max() > info.max:
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: a value does not fit {datatype}")
    return wide.astype(target).tobytes()


def to_binary(value: bytes) -> tuple[bytes, int]:
    """A ``ModelInferRequest`` as a binary-data-extension request: (JSON head + tensor bytes, the head's length).
    The response is asked for in binary (``binary_data_output``), for :func:`response` to rewrap.

    Raises:
        DecodeError: invalid_request: not a ``ModelInferRequest``, or ``raw_input_contents`` given for some inputs
            only, or next to typed contents.
        ValidationError: datatype_mismatch, out_of_range (typed contents; see :func:`_typed_bytes`).
    """
    request = ModelInferRequest()
    try:
        request.ParseFromString(value)
    except (ProtobufDecodeError, RuntimeError) as exc:  # RuntimeError: nesting too deep
        raise DecodeError(R.INVALID_REQUEST, f"value is not a protobuf ModelInferRequest: {exc}") from None
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise DecodeError(
            R.INVALID_REQUEST, f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs"
        )
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for index, tensor in enumerate(request.inputs):
        if raw:
            if tensor.HasField("contents"):
                raise DecodeError(R.INVALID_REQUEST, f"inputs[{index}] has contents next to raw_input_contents")
            blob = raw[index]
        else:
            blob = _typed_bytes(index, tensor, tensor.datatype)
        blobs.append(blob)
        inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                       "parameters": {"binary_data_size": len(blob)}})  # fmt: skip
    head: dict[str, Any] = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    if request.id:
        head["id"] = request.id
    if request.outputs:
        head["outputs"] = [{"name": o.name} for o in request.outputs]
    text = orjson.dumps(head)
    return text + b"".join(blobs), len(text)


def response(value: bytes, json_length: int) -> bytes:
    """A binary-data-extension response (:func:`consumer.oip.encode.encode_response_binary`) as a serialised
    ``ModelInferResponse``: each output's name, datatype and shape, its bytes in ``raw_output_contents``; an
    output's ``classes`` parameter (class labels) as ``string_param`` holding their JSON list.

    Raises:
        ValueError: ``value`` is not such a response (a bug: it is made by streaminfer).
    """
    head = orjson.loads(value[:json_length])
    out = ModelInferResponse(model_name=head["model_name"], model_version=head["model_version"], id=head["id"])
    offset = json_length
    for entry in head["outputs"]:
        tensor = out.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
        parameters = entry.get("parameters", {})
        size = parameters["binary_data_size"]
        if "classes" in parameters:
            tensor.parameters["classes"].string_param = orjson.dumps(parameters["classes"]).decode()
        out.raw_output_contents.append(value[offset : offset + size])
        offset += size
    if offset != len(value):
        raise ValueError(f"{len(value) - offset} bytes of the response belong to no output")
    return out.SerializeToString()  # type: ignore[no-any-return]


def parse_response(value: bytes) -> dict[str, Any]:
    """A serialised ``ModelInferResponse`` (raw or typed contents) in the form of
    :func:`consumer.oip.client.decode_response`: ``{"id", "model_name", "model_version", "outputs": {name:
    ndarray}, "output_parameters": {...}}`` (a ``classes`` string parameter is decoded back to its list).

    Raises:
        google.protobuf.message.DecodeError: not a ``ModelInferResponse``.
        consumer.errors.RecordError: typed contents that do not fit their datatype.
    """
    from consumer.oip.client import decode_response  # the client side imports the encoder, not the other way

    message = ModelInferResponse.FromString(value)
    raw = list(message.raw_output_contents)
    outputs, blobs = [], []
    for index, tensor in enumerate(message.outputs):
        blob = raw[index] if raw else _typed_bytes(index, tensor, tensor.datatype)
        parameters: dict[str, Any] = {"binary_data_size": len(blob)}
        if "classes" in tensor.parameters:
            parameters["classes"] = orjson.loads(tensor.parameters["classes"].string_param)
        outputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                        "parameters": parameters})  # fmt: skip
        blobs.append(blob)
    head = orjson.dumps({"id": message.id, "model_name": message.model_name, "model_version": message.model_version,
                         "outputs": outputs})  # fmt: skip
    return decode_response(head + b"".join(blobs), len(head))


def answer_headers() -> Sequence[tuple[str, bytes]]:
    """The headers of a protobuf answer (after ``correlation_id``)."""
    return ((CONTENT_TYPE_HEADER, PROTOBUF), (SELDON_TYPE_HEADER, PROTO_RESPONSE))
