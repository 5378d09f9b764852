"""Which event fields feed which model input, checked against the model at start-up, and how a chunk of events
becomes one tensor per input.

Without a mapping file every model input of shape ``[batch]`` or ``[batch, 1]`` is fed by the event field of its
own name (skl2onnx and onnxmltools pipelines with one input per column look like this). Otherwise
``input_mapping`` names a YAML file::

    inputs:
      features:                         # a model input, here FLOAT [batch, 3]
        - amount                        # a field by dotted path (nested records): required
        - field: device.age_days
          default: 0                    # taken when the field is absent or null
        - field: merchant_category
          lookup: {"5411": 0, "5812": 1} # category -> code (keys compared exactly: "5411" is not 5411)
          unknown: -1                   # what a value not in the table gets (absent: unknown_category)
      embedding:                        # FLOAT [batch, 384]
        - embedding                     # one array field: the whole feature vector, its length checked per record
    outputs:
      probabilities: fraud_probability  # output -> result field (absent: the output's own name)
      label: null                       # null: left out of the enriched result

Rules, checked when the consumer starts (:func:`load_mapping`; a mismatch is a :class:`~consumer.errors.ModelError`,
exit 3, naming the field and the input):

- every model input is mapped, and only model inputs are; an input is ``[batch]`` (one scalar field), ``[batch, N]``
  (N scalar fields, or one array field of length N; N static for an array field) or ``[batch, 1]``;
- numeric inputs take numbers, ``tensor(string)`` inputs take strings (encoders inside the graph), bool inputs take
  booleans; only lossless casts (a fraction never feeds an integer, a boolean never feeds a number); a default, a
  lookup code and an ``unknown`` code must fit the input's type;
- a result field (an output's name or the one the mapping gives) must not be a field the mapping reads.

Per record (:meth:`InputMapping.tensors`), a field absent or null without a default is ``missing_field``, a value of
the wrong type (or out of the input's range, or an array of the wrong length) ``wrong_type``, a value missing from
a lookup table without ``unknown`` ``unknown_category``.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from consumer.errors import DeadLetterReason, ModelError, RecordError, ValidationError
from consumer.signature import ModelSignature, TensorSpec

#: The types a JSON or Avro number decodes to (a boolean is neither).
_NUMBER_TYPES = frozenset({int, float})
#: The Avro types whose values fastavro reads as an int or a float.
_AVRO_NUMBERS = frozenset({"int", "long", "float", "double"})
#: Marks a field without a default (``None`` is a legal default for nothing: a null is "missing").
REQUIRED: Any = object()
#: Largest float32 magnitude: a number above it does not fit a float32 input.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class FieldSpec:
    """One field feeding one column of an input.

    Attributes:
        name: the dotted path as written (``device.age_days``).
        path: its parts.
        default: the value taken when the field is absent or null; :data:`REQUIRED` when there is none.
        lookup: category -> code, or None.
        unknown: a lookup's code for a value not in it; :data:`REQUIRED`: ``unknown_category``.
    """

    name: str
    path: tuple[str, ...]
    default: Any = REQUIRED
    lookup: Mapping[Any, Any] | None = None
    unknown: Any = REQUIRED


@dataclass(frozen=True)
class InputPlan:
    """How one model input is fed.

    Attributes:
        spec: the model input.
        fields: its fields, in column order.
        width: values per row: 1 for ``[batch]`` and ``[batch, 1]``, N for ``[batch, N]``.
        array: one array field holds the row's ``width`` values.
    """

    spec: TensorSpec
    fields: tuple[FieldSpec, ...]
    width: int
    array: bool = False

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The input's non-batch shape: ``()`` for ``[batch]``, ``(width,)`` otherwise."""
        return () if len(self.spec.shape) == 1 else (self.width,)


@dataclass(frozen=True)
class InputMapping:
    """The mapping of a model's inputs to event fields, and of its outputs to result fields.

    Attributes:
        inputs: one plan per model input, in the model's input order.
        outputs: (output name, result field name) of every output the enriched result carries.
        read: the top-level event fields the mapping reads (a result field must not be one of them).
    """

    inputs: tuple[InputPlan, ...]
    outputs: tuple[tuple[str, str], ...]
    read: frozenset[str] = field(default=frozenset())

    @property
    def shape_key(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Every input's non-batch shape, name-sorted (:attr:`consumer.work.DecodedRequest.shape_key`)."""
        return tuple(sorted((plan.spec.name, plan.row_shape) for plan in self.inputs))

    @property
    def field_paths(self) -> tuple[tuple[str, ...], ...]:
        """The paths of every field the mapping reads, in input order (an Avro writer schema is checked for them)."""
        return tuple(f.path for plan in self.inputs for f in plan.fields)

    def tensors(
        self, events: Sequence[dict[str, Any]], numbers: bool = False
    ) -> tuple[dict[str, np.ndarray], list[RecordError | None]]:
        """One tensor per input for ``events`` (decoded objects, one per record), rows in event order, and each
        event's error (None when it feeds every input).

        Args:
            numbers: every field the mapping reads is known to be present in every event as an int or a float
                (Avro events whose writer schemas declare each one ``int``, ``long``, ``float`` or ``double``:
                :meth:`numeric`): the per-value type scan is skipped.

        Returns:
            (block, errors): input name -> array ``[kept, ...]`` of the model's dtype holding only the events whose
            error is None, in order; and one error or None per event.
        """
        fast = self._numbers(events, numbers)
        if fast is not None:
            return fast, [None] * len(events)
        errors: list[RecordError | None] = [None] * len(events)
        columns: list[tuple[InputPlan, list[list[Any]]]] = []
        for plan in self.inputs:
            columns.append((plan, [_column(events, f, errors, plan) for f in plan.fields]))
        kept = [i for i, e in enumerate(errors) if e is None]
        block: dict[str, np.ndarray] = {}
        for plan, values in columns:
            arr, bad = _array(plan, values, kept)
            if bad:  # a value that fails only once converted (an array of the wrong length, out of range)
                for i, err in bad.items():
                    errors[i] = err
                return self._again(events, errors)
            block[plan.spec.name] = arr
        return block, errors

    def _numbers(self, events: Sequence[dict[str, Any]], typed: bool = False) -> dict[str, np.ndarray] | None:
        """The common case at C speed: every input a float one fed by top-level scalar fields without lookups, every
        event holding every field as a number (an int or a float, no boolean, no null) within float32 where an input
        is float32: one ``itemgetter`` over all the fields per event, one type scan, one array. None when any of that
        does not hold (the general path then names each culprit)."""
        getter = self._getter
        if getter is None or not events:
            return None
        try:
            rows = list(map(getter, events))
        except KeyError:
            return None
        values = rows if self._width == 1 else itertools.chain.from_iterable(rows)
        if not typed and not set(map(type, values)) <= _NUMBER_TYPES:
            return None
        return self._blocked(np.array(rows, dtype=np.float64).reshape(len(events), self._width))

    def number_columns(self, columns: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray] | None:
        """:meth:`_numbers` of events whose fields are already number columns (an Avro chunk read by
        :meth:`consumer.events.avro.FixedTail.read_columns`): the same block from the same values, without the
        events.

        Args:
            columns: top-level field -> its values over the events, ``[rows]`` float64 or float32 (each value
                exactly the float the event holds).
            rows: the events.

        Returns:
            the block, or None when :meth:`_numbers` does not apply to the mapping, a field it reads is not a
            column, or a value is not finite or not within float32 where an input is float32.
        """
        getter = self._getter
        if getter is None or rows == 0:
            return None
        names = [f.path[0] for plan in self.inputs for f in plan.fields]
        if any(name not in columns for name in names):
            return None
        arr = np.empty((rows, self._width), dtype=np.float64)
        for j, name in enumerate(names):
            arr[:, j] = columns[name]
        return self._blocked(arr)

    def _blocked(self, arr: np.ndarray) -> dict[str, np.ndarray] | None:
        """The block of ``arr`` (``[events, every field's column]`` float64, fields in input order) once every value
        is finite and within float32 where an input is float32; else None."""
        if not np.isfinite(arr).all() or (self._float32 and float(np.abs(arr).max()) > _FLOAT32_MAX):
            return None
        rows = arr.shape[0]
        block = {}
        start = 0
        for plan in self.inputs:
            part = arr[:, start : start + plan.width]
            block[plan.spec.name] = np.ascontiguousarray(part, dtype=plan.spec.dtype).reshape((rows, *plan.row_shape))
            start += plan.width
        return block

    @functools.cached_property
    def _getter(self) -> Callable[[dict[str, Any]], Any] | None:
        """An ``itemgetter`` of every field, in input order, when :meth:`_numbers` applies to the mapping."""
        for plan in self.inputs:
            if plan.array or plan.spec.dtype.kind != "f":
                return None
            if any(len(f.path) != 1 or f.lookup is not None for f in plan.fields):
                return None
        return operator.itemgetter(*(f.path[0] for plan in self.inputs for f in plan.fields))

    def numeric(self, schema: Any) -> bool:
        """Whether Avro record ``schema`` (fastavro's parsed form, logical types raw) declares every field the
        mapping reads as ``int``, ``long``, ``float`` or ``double`` (no union, no null) and the mapping is one
        :meth:`_numbers` applies to: its records then hold each as an int or a float (``tensors(numbers=True)``)."""
        if self._getter is None or not isinstance(schema, dict):
            return False
        types = {f.get("name"): f.get("type") for f in schema.get("fields", ())}
        wanted = [types.get(f.path[0]) for plan in self.inputs for f in plan.fields]
        return all(isinstance(t, str) and t in _AVRO_NUMBERS for t in wanted)

    @functools.cached_property
    def _width(self) -> int:
        return sum(plan.width for plan in self.inputs)

    @functools.cached_property
    def _float32(self) -> bool:
        return any(plan.spec.dtype.itemsize <= 4 for plan in self.inputs)

    def _again(
        self, events: Sequence[dict[str, Any]], errors: list[RecordError | None]
    ) -> tuple[dict[str, np.ndarray], list[RecordError | None]]:
        """The tensors of the events still without an error (after one was found during conversion)."""
        good = [i for i, e in enumerate(errors) if e is None]
        block, sub = self.tensors([events[i] for i in good])
        for i, err in zip(good, sub, strict=True):
            errors[i] = err
        return block, errors


# ------------------------------------------------------------------------------------------------ loading
def load_mapping(signature: ModelSignature, path: Path | None, enrich: bool) -> InputMapping:
    """The mapping of ``path`` (YAML), or the one by name when ``path`` is None, checked against the model.

    Args:
        enrich: results are enriched events: result field names must not clash with fields the mapping reads.

    Raises:
        ModelError: the model cannot be fed from events as mapped (the field and the input named), or the file is
            unreadable or malformed.
    """
    if signature.sequence is not None or signature.image is not None:
        raise ModelError(
            "events feed tabular models: a sequence or image model takes OIP requests (request_format=oip)"
        )
    if path is None:
        plans = tuple(_by_name(spec) for spec in signature.inputs)
        outputs = tuple((o.name, o.name) for o in signature.outputs)
    else:
        raw = _read(path)
        plans = _plans(signature, raw.get("inputs"), path)
        outputs = _outputs(signature, raw.get("outputs"), path)
    read = frozenset(f.path[0] for plan in plans for f in plan.fields)
    if enrich:
        names = [name for _, name in outputs]
        for output, name in outputs:
            if name in read:
                raise ModelError(f"output {output!r} would be written to field {name!r}, which the mapping reads")
            if names.count(name) > 1:
                raise ModelError(f"two outputs would be written to result field {name!r}")
    return InputMapping(plans, outputs, read)


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ModelError(f"input_mapping {str(path)!r}: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("inputs"), dict):
        raise ModelError(f"input_mapping {str(path)!r}: expected a mapping with 'inputs' (and optionally 'outputs')")
    unknown = set(raw) - {"inputs", "outputs"}
    if unknown:
        raise ModelError(f"input_mapping {str(path)!r}: unknown key {sorted(unknown)[0]!r} (inputs, outputs)")
    return raw


def _by_name(spec: TensorSpec) -> InputPlan:
    """An input fed by the field of its own name: only ``[batch]`` or ``[batch, 1]``."""
    if len(spec.shape) == 1 or (len(spec.shape) == 2 and spec.shape[1] == 1):
        return _checked(InputPlan(spec, (FieldSpec(spec.name, (spec.name,)),), 1))
    shape = ["batch", *("?" if d is None else d for d in spec.shape[1:])]
    raise ModelError(
        f"model input {spec.name!r} has shape {shape}: an event field feeds an input of shape [batch] or [batch, 1] "
        "by name; map fields onto it with input_mapping (docs/events.md)"
    )


def _plans(signature: ModelSignature, raw: Any, path: Path) -> tuple[InputPlan, ...]:
    assert isinstance(raw, dict)
    names = {spec.name for spec in signature.inputs}
    for name in raw:
        if name not in names:
            raise ModelError(
                f"input_mapping maps {name!r}, which is not an input of the model (inputs: {sorted(names)})"
            )
    plans = []
    for spec in signature.inputs:
        if spec.name not in raw:
            raise ModelError(f"input_mapping {str(path)!r} does not map model input {spec.name!r}")
        entries = raw[spec.name]
        if isinstance(entries, (str, dict)):
            entries = [entries]
        if not isinstance(entries, list) or not entries:
            raise ModelError(f"input_mapping: input {spec.name!r} needs a list of fields")
        fields = tuple(_field(spec, entry) for entry in entries)
        plans.append(_checked(_shaped(spec, fields)))
    return tuple(plans)


def _field(spec: TensorSpec, entry: Any) -> FieldSpec:
    if isinstance(entry, str):
        entry = {"field": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("field"), str) or not entry["field"]:
        raise ModelError(f"input_mapping: input {spec.name!r}: each field is a dotted path or {{field: path, ...}}")
    unknown = set(entry) - {"field", "default", "lookup", "unknown"}
    if unknown:
        raise ModelError(f"input_mapping: field {entry['field']!r}: unknown key {sorted(unknown)[0]!r}")
    name = entry["field"]
    lookup = entry.get("lookup")
    if lookup is not None and (not isinstance(lookup, dict) or not lookup):
        raise ModelError(f"input_mapping: field {name!r}: lookup must be a table of category: code")
    if "unknown" in entry and lookup is None:
        raise ModelError(f"input_mapping: field {name!r}: unknown is the code of a value missing from a lookup")
    return FieldSpec(
        name,
        tuple(name.split(".")),
        entry.get("default", REQUIRED) if "default" in entry and entry["default"] is not None else REQUIRED,
        lookup,
        entry.get("unknown", REQUIRED),
    )


def _shaped(spec: TensorSpec, fields: tuple[FieldSpec, ...]) -> InputPlan:
    """The plan of ``fields`` feeding ``spec``, its width checked against the input's shape."""
    shape = spec.shape
    if len(shape) not in (1, 2):
        raise ModelError(f"model input {spec.name!r} has rank {len(shape)}: events feed [batch] or [batch, N] inputs")
    if len(shape) == 1:
        if len(fields) != 1:
            raise ModelError(f"model input {spec.name!r} is [batch]: map one field onto it, not {len(fields)}")
        return InputPlan(spec, fields, 1)
    width = shape[1]
    if len(fields) == 1 and width != 1:  # one field for a vector: an array field
        if width is None:
            raise ModelError(
                f"model input {spec.name!r} is [batch, ?]: an array field needs a static length; map scalar fields"
            )
        return InputPlan(spec, fields, width, array=True)
    if width is not None and width != len(fields):
        raise ModelError(
            f"model input {spec.name!r} is [batch, {width}]: map {width} fields onto it, not {len(fields)}"
        )
    return InputPlan(spec, fields, len(fields))


def _checked(plan: InputPlan) -> InputPlan:
    """``plan`` once its defaults, lookup codes and ``unknown`` codes fit the input's type."""
    for f in plan.fields:
        for what, value in (("default", f.default), ("unknown", f.unknown)):
            if value is not REQUIRED and not _fits(plan, value):
                raise ModelError(f"input_mapping: field {f.name!r}: {what} {value!r} does not fit input {_kind(plan)}")
        for category, code in (f.lookup or {}).items():
            if not _fits(plan, code):
                raise ModelError(
                    f"input_mapping: field {f.name!r}: lookup code {code!r} of {category!r} does not fit input "
                    f"{_kind(plan)}"
                )
    return plan


def _fits(plan: InputPlan, value: Any) -> bool:
    if plan.array:
        return isinstance(value, list) and len(value) == plan.width and all(_scalar_fits(plan.spec, v) for v in value)
    return _scalar_fits(plan.spec, value)


def _scalar_fits(spec: TensorSpec, value: Any) -> bool:
    return _value_error(spec, value) is None


def _kind(plan: InputPlan) -> str:
    return f"{plan.spec.name!r} ({plan.spec.datatype})"


def _outputs(signature: ModelSignature, raw: Any, path: Path) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return tuple((o.name, o.name) for o in signature.outputs)
    names = {o.name for o in signature.outputs}
    if not isinstance(raw, dict):
        raise ModelError(f"input_mapping {str(path)!r}: outputs must map output names to result field names")
    for name, target in raw.items():
        if name not in names:
            raise ModelError(f"input_mapping names output {name!r}, which the model does not have ({sorted(names)})")
        if target is not None and (not isinstance(target, str) or not target or "." in target):
            raise ModelError(
                f"input_mapping: output {name!r}: a result field is a plain name (or null), not {target!r}"
            )
    return tuple((o.name, raw.get(o.name, o.name)) for o in signature.outputs if raw.get(o.name, o.name) is not None)


# ------------------------------------------------------------------------------------------------ per chunk
def _column(
    events: Sequence[dict[str, Any]], f: FieldSpec, errors: list[RecordError | None], plan: InputPlan
) -> list[Any]:
    """The values of ``f`` in every event (defaults and lookups applied); an event whose value is missing, of the
    wrong type or not in the lookup gets its error (the first one found counts) and a placeholder."""
    if len(f.path) == 1:
        key = f.path[0]
        values = [ev.get(key) for ev in events]
    else:
        values = [_dig(ev, f.path) for ev in events]
    placeholder: Any = 0 if not plan.array else [0] * plan.width
    if plan.spec.dtype.kind in "OUS":
        placeholder = "" if not plan.array else [""] * plan.width
    if None in values or _NOT_AN_OBJECT in values:
        for i, v in enumerate(values):
            if v is None:
                if f.default is REQUIRED:
                    _first(
                        errors,
                        i,
                        ValidationError(DeadLetterReason.MISSING_FIELD, f"field {f.name!r} is missing or null"),
                    )
                    values[i] = placeholder
                else:
                    values[i] = f.default
            elif v is _NOT_AN_OBJECT:
                parent = ".".join(f.path[:-1])
                _first(errors, i, ValidationError(DeadLetterReason.WRONG_TYPE, f"field {parent!r} is not an object"))
                values[i] = placeholder
    if f.lookup is not None:
        table = f.lookup
        for i, v in enumerate(values):
            try:
                code = table.get(v, _ABSENT)
            except TypeError:  # an unhashable value (an object, an array)
                code = _ABSENT
            if code is _ABSENT:
                if f.unknown is REQUIRED:
                    if errors[i] is None:
                        errors[i] = ValidationError(
                            DeadLetterReason.UNKNOWN_CATEGORY,
                            f"field {f.name!r}: {_show(v)} is not in its lookup table",
                        )
                    values[i] = placeholder
                else:
                    values[i] = f.unknown
            else:
                values[i] = code
        return values
    _check_types(values, f, plan, errors, placeholder)
    return values


def _check_types(
    values: list[Any], f: FieldSpec, plan: InputPlan, errors: list[RecordError | None], placeholder: Any
) -> None:
    """Mark each value that cannot feed the input losslessly (a set of types tells first whether any may not)."""
    spec = plan.spec
    kinds = set(map(type, values))
    kind = spec.dtype.kind
    if plan.array:
        if kinds == {list}:
            return  # elements and lengths are checked when the column becomes an array
    elif (
        (kind == "f" and kinds <= {int, float})
        or (kind in "iu" and kinds == {int})
        or (kind == "b" and kinds == {bool})
        or (kind in "OUS" and kinds == {str})
    ):
        return
    for i, v in enumerate(values):
        problem = _array_error(plan, v) if plan.array else _value_error(spec, v)
        if problem is not None:
            _first(errors, i, ValidationError(DeadLetterReason.WRONG_TYPE, f"field {f.name!r}: {problem}"))
            values[i] = placeholder


def _value_error(spec: TensorSpec, v: Any) -> str | None:
    """Why ``v`` cannot feed ``spec`` (one element), or None."""
    kind = spec.dtype.kind
    t = type(v)
    if kind == "f":
        if t is not int and t is not float:
            return f"{_show(v)} is not a number (input {spec.name!r} is {spec.datatype})"
        if not math.isfinite(v) or (spec.dtype.itemsize <= 4 and abs(v) > _FLOAT32_MAX):
            return f"{_show(v)} does not fit {spec.datatype}"
        return None
    if kind in "iu":
        if t is float and v.is_integer():
            v = int(v)
        elif t is not int:
            return f"{_show(v)} is not an integer (input {spec.name!r} is {spec.datatype})"
        info = np.iinfo(spec.dtype.name)
        return None if info.min <= v <= info.max else f"{v} does not fit {spec.datatype}"
    if kind == "b":
        return None if t is bool else f"{_show(v)} is not a boolean (input {spec.name!r} is BOOL)"
    return None if t is str else f"{_show(v)} is not a string (input {spec.name!r} is BYTES)"


def _array_error(plan: InputPlan, v: Any) -> str | None:
    if type(v) is not list:
        return f"{_show(v)} is not an array of {plan.width} (input {plan.spec.name!r})"
    if len(v) != plan.width:
        return f"an array of {len(v)} where input {plan.spec.name!r} takes {plan.width}"
    for element in v:
        problem = _value_error(plan.spec, element)
        if problem is not None:
            return f"an element: {problem}"
    return None


def _array(plan: InputPlan, columns: list[list[Any]], kept: list[int]) -> tuple[np.ndarray, dict[int, RecordError]]:
    """The input's tensor ``[len(kept), ...]`` of the model's dtype from its columns (rows ``kept`` only), or the
    errors of the rows that fail once converted (range, exactness, array lengths)."""
    spec = plan.spec
    dtype = spec.dtype
    n = len(kept)
    if plan.array:
        rows = [columns[0][i] for i in kept]
        bad = {kept[k]: _error(plan, r) for k, r in enumerate(rows) if _array_error(plan, r) is not None}
        if bad:
            return np.empty(0), bad
        flat = rows
    else:
        cols = columns if len(kept) == len(columns[0]) else [[c[i] for i in kept] for c in columns]
        flat = list(zip(*cols, strict=True)) if len(cols) > 1 else cols[0]
    if dtype.kind in "OUS":  # strings: an object array, filled element by element (numpy would make '<U' of them)
        items = [x for row in flat for x in row] if plan.array or len(columns) > 1 else flat
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return _shape(plan, arr, n), {}
    work = np.float64 if dtype.kind == "f" else np.int64 if dtype.kind in "iu" else np.bool_
    try:
        arr = np.array(flat, dtype=work)
    except (OverflowError, ValueError, TypeError):  # an integer beyond int64: find it record by record
        return np.empty(0), _row_errors(plan, columns, kept)
    if dtype.kind == "f" and dtype.itemsize <= 4 and arr.size and float(np.abs(arr).max()) > _FLOAT32_MAX:
        return np.empty(0), _row_errors(plan, columns, kept)
    if dtype.kind in "iu" and dtype != np.int64 and arr.size:
        info = np.iinfo(dtype.name)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            return np.empty(0), _row_errors(plan, columns, kept)
    return _shape(plan, np.ascontiguousarray(arr, dtype=dtype), n), {}


def _shape(plan: InputPlan, arr: np.ndarray, n: int) -> np.ndarray:
    return arr.reshape((n, *plan.row_shape))


def _row_errors(plan: InputPlan, columns: list[list[Any]], kept: list[int]) -> dict[int, RecordError]:
    bad: dict[int, RecordError] = {}
    for i in kept:
        for f, column in zip(plan.fields, columns, strict=True):
            problem = _value_error(plan.spec, column[i])
            if problem is not None:
                bad[i] = ValidationError(DeadLetterReason.WRONG_TYPE, f"field {f.name!r}: {problem}")
                break
    if not bad:  # nothing found value by value: should not happen; name the input rather than loop
        bad = {
            i: ValidationError(DeadLetterReason.WRONG_TYPE, f"input {plan.spec.name!r}: a value does not fit")
            for i in kept
        }
    return bad


def _error(plan: InputPlan, v: Any) -> RecordError:
    return ValidationError(DeadLetterReason.WRONG_TYPE, f"field {plan.fields[0].name!r}: {_array_error(plan, v)}")


def _first(errors: list[RecordError | None], i: int, error: RecordError) -> None:
    if errors[i] is None:
        errors[i] = error


#: Stands for a nested field whose parent is not an object.
_NOT_AN_OBJECT: Any = object()
_ABSENT: Any = object()


def _dig(event: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path``; None when a part is absent or null; :data:`_NOT_AN_OBJECT` when a parent is neither."""
    value: Any = event
    for part in path:
        if value is None:
            return None
        if type(value) is not dict:
            return _NOT_AN_OBJECT
        value = value.get(part)
    return value


def _show(v: Any) -> str:
    """A value for a dead-letter message: its JSON-ish text, at most 40 characters, and its type."""
    text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({type(v).__name__})"
