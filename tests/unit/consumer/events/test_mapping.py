"""The input mapping (consumer/events/mapping.py): checked against the model at start-up (a mismatch names the field
and the input), and a chunk of events turned into one tensor per input, each bad event with its reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumer.errors import DeadLetterReason as R
from consumer.errors import ModelError
from consumer.events.mapping import InputMapping, load_mapping
from consumer.signature import ModelSignature, SequenceSpec, TensorSpec

F32, I64, I32, OBJ, B = np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.int32), np.dtype(object), np.dtype(bool)


def signature(*inputs: TensorSpec, outputs: tuple[TensorSpec, ...] | None = None) -> ModelSignature:
    outs = outputs or (TensorSpec("label", I64, (None,)), TensorSpec("probabilities", F32, (None, 2)))
    return ModelSignature("m", "1", inputs, outs)


def mapping_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mapping.yaml"
    path.write_text(text)
    return path


def reasons(mapping: InputMapping, events: list[dict[str, Any]]) -> list[str | None]:
    _, errors = mapping.tensors(events)
    return [e.reason.value if e is not None else None for e in errors]


# ------------------------------------------------------------------------------------------------ by name
def test_inputs_of_one_column_are_fed_by_the_field_of_their_name() -> None:
    sig = signature(TensorSpec("amount", F32, (None, 1)), TensorSpec("age", I64, (None,)))
    mapping = load_mapping(sig, None, enrich=True)
    block, errors = mapping.tensors([{"amount": 12.5, "age": 40, "other": "x"}, {"amount": 3, "age": 7}])
    assert errors == [None, None]
    assert block["amount"].dtype == F32
    assert block["amount"].tolist() == [[12.5], [3.0]]
    assert block["age"].dtype == I64
    assert block["age"].tolist() == [40, 7]
    assert mapping.outputs == (("label", "label"), ("probabilities", "probabilities"))


def test_a_vector_input_without_a_mapping_is_refused_naming_it() -> None:
    sig = signature(TensorSpec("features", F32, (None, 30)))
    with pytest.raises(ModelError, match=r"model input 'features' has shape \['batch', 30\].*input_mapping"):
        load_mapping(sig, None, enrich=True)


def test_sequence_models_and_higher_ranks_take_oip_requests(tmp_path: Path) -> None:
    ids = TensorSpec("input_ids", I64, (None, None))
    text = dataclasses.replace(signature(ids), sequence=SequenceSpec(("input_ids",), {"input_ids": 0}, 512, {}))
    with pytest.raises(ModelError, match=r"events feed tabular models"):
        load_mapping(text, None, enrich=False)
    pixels = signature(TensorSpec("x", F32, (None, None, None, 3)))
    with pytest.raises(ModelError, match=r"'x' has rank 4: events feed \[batch\] or \[batch, N\] inputs"):
        load_mapping(pixels, mapping_file(tmp_path, "inputs:\n  x: [image]\n"), enrich=False)


# ------------------------------------------------------------------------------------------------ a mapping file
MAPPING = """
inputs:
  features:
    - amount
    - field: device.age_days
      default: 0
    - field: merchant_category
      lookup: {"5411": 0, "5812": 1}
      unknown: -1
outputs:
  probabilities: fraud_probability
  label: null
"""


def test_a_mapping_file_feeds_a_vector_from_nested_fields_defaults_and_lookups(tmp_path: Path) -> None:
    sig = signature(TensorSpec("features", F32, (None, 3)))
    mapping = load_mapping(sig, mapping_file(tmp_path, MAPPING), enrich=True)
    events = [
        {"amount": 12.3, "merchant_category": "5411", "device": {"age_days": 40}},
        {"amount": 1, "merchant_category": "5812", "device": None},  # null parent: the default
        {"amount": 2.5, "merchant_category": "9999"},  # absent parent: the default; unknown category: -1
    ]
    block, errors = mapping.tensors(events)
    assert errors == [None, None, None]
    assert block["features"].tolist() == [[np.float32(12.3), 40, 0], [1, 0, 1], [2.5, 0, -1]]
    assert mapping.outputs == (("probabilities", "fraud_probability"),)  # label left out


def test_each_bad_event_gets_its_reason_and_the_rest_their_rows(tmp_path: Path) -> None:
    text = """
inputs:
  features:
    - amount
    - device.age_days
    - field: category
      lookup: {a: 1, b: 2}
"""
    sig = signature(TensorSpec("features", F32, (None, 3)))
    mapping = load_mapping(sig, mapping_file(tmp_path, text), enrich=True)
    good = {"amount": 1.5, "device": {"age_days": 3}, "category": "a"}
    events = [
        good,
        {"device": {"age_days": 3}, "category": "a"},  # amount absent
        {"amount": None, "device": {"age_days": 3}, "category": "a"},  # amount null
        {"amount": "12", "device": {"age_days": 3}, "category": "a"},  # a numeric string is no number
        {"amount": True, "device": {"age_days": 3}, "category": "a"},  # a boolean is no number
        {"amount": 1.0, "device": "old", "category": "a"},  # a parent that is not an object
        {"amount": 1.0, "device": {"age_days": 3}, "category": "z"},  # not in the lookup
        {"amount": 1e39, "device": {"age_days": 3}, "category": "b"},  # beyond float32
        {"amount": 2.0, "device": {"age_days": 3}, "category": ["a"]},  # unhashable: not in the lookup
        dict(good, amount=7.0),
    ]
    block, errors = mapping.tensors(events)
    assert [e.reason.value if e else None for e in errors] == [
        None,
        R.MISSING_FIELD,
        R.MISSING_FIELD,
        R.WRONG_TYPE,
        R.WRONG_TYPE,
        R.WRONG_TYPE,
        R.UNKNOWN_CATEGORY,
        R.WRONG_TYPE,
        R.UNKNOWN_CATEGORY,
        None,
    ]
    assert "field 'amount'" in str(errors[1])
    assert "'12' (str) is not a number" in str(errors[3])
    assert block["features"].tolist() == [[1.5, 3.0, 1.0], [7.0, 3.0, 1.0]]  # the good events only, in order


def test_integer_inputs_take_integers_only(tmp_path: Path) -> None:
    sig = signature(TensorSpec("n", I32, (None,)))
    mapping = load_mapping(sig, None, enrich=False)
    assert reasons(mapping, [{"n": 3}, {"n": 3.0}, {"n": 3.5}, {"n": 2**40}, {"n": "3"}, {"n": False}]) == [
        None,
        None,  # an integral float is exact
        R.WRONG_TYPE,
        R.WRONG_TYPE,  # beyond int32
        R.WRONG_TYPE,
        R.WRONG_TYPE,
    ]


def test_string_and_boolean_inputs(tmp_path: Path) -> None:
    sig = signature(TensorSpec("city", OBJ, (None, 1)), TensorSpec("member", B, (None,)))
    mapping = load_mapping(sig, None, enrich=False)
    block, errors = mapping.tensors(
        [{"city": "Oslo", "member": True}, {"city": 7, "member": True}, {"city": "Rome", "member": 1}]
    )
    assert [e.reason.value if e else None for e in errors] == [None, R.WRONG_TYPE, R.WRONG_TYPE]
    assert block["city"].dtype == OBJ
    assert block["city"].tolist() == [["Oslo"]]
    assert block["member"].tolist() == [True]


def test_an_array_field_is_a_whole_feature_vector_of_checked_length(tmp_path: Path) -> None:
    sig = signature(TensorSpec("embedding", F32, (None, 3)))
    mapping = load_mapping(sig, mapping_file(tmp_path, "inputs:\n  embedding: [vector]\n"), enrich=False)
    events = [
        {"vector": [1, 2, 3]},
        {"vector": [1, 2]},
        {"vector": "abc"},
        {"vector": [1, "x", 3]},
        {"vector": [4.5, 5, 6]},
    ]
    block, errors = mapping.tensors(events)
    assert [e.reason.value if e else None for e in errors] == [None, R.WRONG_TYPE, R.WRONG_TYPE, R.WRONG_TYPE, None]
    assert "an array of 2 where input 'embedding' takes 3" in str(errors[1])
    assert block["embedding"].tolist() == [[1, 2, 3], [4.5, 5, 6]]


FIRST = "inputs:\n  features: "
OTHER = "\n  other: [d]\n"
GOOD = FIRST + "[a, b, c]" + OTHER


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("inputs:\n  nope: [a]\n", r"maps 'nope', which is not an input of the model"),
        ("inputs:\n  other: [a]\n", r"does not map model input 'features'"),
        ("inputs:\n  features: [a, b]\n  other: [c]\n", r"\[batch, 3\]: map 3 fields onto it, not 2"),
        ("inputs:\n  features: [{field: a, default: x}, b, c]\n  other: [d]\n", r"field 'a': default 'x' does not fit"),
        (
            "inputs:\n  features: [{field: a, lookup: {k: y}}, b, c]\n  other: [d]\n",
            r"lookup code 'y' of 'k' does not fit",
        ),
        (
            "inputs:\n  features: [{field: a, unknown: 1}, b, c]\n  other: [d]\n",
            r"unknown is the code of a value missing",
        ),
        ("inputs:\n  features: [{field: a, colour: 1}, b, c]\n  other: [d]\n", r"unknown key 'colour'"),
        ("inputs:\n  features: [a, b, c]\n  other: [d]\noutputs:\n  score: s\n", r"names output 'score'"),
        (
            "inputs:\n  features: [a, b, c]\n  other: [d]\noutputs:\n  label: a\n",
            r"output 'label' would be written to field 'a'",
        ),
        (
            "inputs:\n  features: [a, b, c]\n  other: [d]\noutputs:\n  label: p\n  probabilities: p\n",
            r"two outputs .* 'p'",
        ),
        ("[1, 2]\n", r"expected a mapping with 'inputs'"),
        ("inputs: {features: [a, b, c], other: [d]}\nextra: 1\n", r"unknown key 'extra'"),
        ("inputs: {features: [a, b, c], other: [d]\n", r"input_mapping .*mapping.yaml"),  # not YAML
    ],
)
def test_a_mapping_that_does_not_fit_the_model_is_refused_naming_the_field_and_input(
    tmp_path: Path, text: str, message: str
) -> None:
    sig = signature(TensorSpec("features", F32, (None, 3)), TensorSpec("other", I64, (None, 1)))
    with pytest.raises(ModelError, match=message):
        load_mapping(sig, mapping_file(tmp_path, text), enrich=True)


def test_a_dynamic_width_takes_its_fields_count_but_an_array_field_needs_a_static_one(tmp_path: Path) -> None:
    sig = signature(TensorSpec("features", F32, (None, None)))
    mapping = load_mapping(sig, mapping_file(tmp_path, "inputs:\n  features: [a, b]\n"), enrich=False)
    assert mapping.tensors([{"a": 1, "b": 2}])[0]["features"].shape == (1, 2)
    with pytest.raises(ModelError, match="needs a static length"):
        load_mapping(sig, mapping_file(tmp_path, "inputs:\n  features: [vector]\n"), enrich=False)


def test_number_fields_take_the_fast_path_and_anything_else_the_checked_one() -> None:
    sig = signature(
        *(TensorSpec(f"x{i}", F32, (None, 1)) for i in range(3)), TensorSpec("y", np.dtype(np.float64), (None,))
    )
    mapping = load_mapping(sig, None, enrich=False)
    numbers = [{"x0": 1, "x1": 2.5, "x2": -3, "y": 1e300}, {"x0": 0.1, "x1": 0, "x2": 7, "y": 4}]
    block, errors = mapping.tensors(numbers)
    assert errors == [None, None]
    assert [block[f"x{i}"].tolist() for i in range(3)] == [[[1.0], [np.float32(0.1)]], [[2.5], [0.0]], [[-3.0], [7.0]]]
    assert block["y"].tolist() == [1e300, 4.0]  # float64 input: beyond float32 is fine
    assert all(a.flags.c_contiguous for a in block.values())
    odd = [dict(numbers[0], x1=True), dict(numbers[0], x2=None), dict(numbers[0], x0="1"), dict(numbers[0], x0=1e39)]
    assert reasons(mapping, [*odd, numbers[1]]) == [R.WRONG_TYPE, R.MISSING_FIELD, R.WRONG_TYPE, R.WRONG_TYPE, None]
