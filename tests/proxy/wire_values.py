"""What the differential tests of the fronts' plain JSON generate and compare (`_plain`,
decision 0061; `_modern_plain`, decision 0062)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_read(value: Any) -> str:
    """A value as a host reads it: key order included."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6)
numbers = st.floats(allow_nan=False, allow_infinity=False, width=32)
json_values = st.recursive(
    scalars | numbers,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def objects(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects of any subset of `fields` (in any order), and now and then a stray key."""
    keys = list(fields)
    return st.lists(st.sampled_from([*keys, "stray"]), unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({key: fields.get(key, json_values) for key in chosen})
    )


# A tool's schemas, and a call result's content blocks, well formed and not.
schemas = json_values | objects(
    {
        "type": st.just("object") | json_values,
        "properties": json_values
        | st.dictionaries(
            st.text(max_size=3),
            st.just({"type": "string"}) | st.booleans() | json_values,
            max_size=2,
        ),
        "required": json_values | st.lists(st.text(max_size=2), max_size=2),
        "$schema": st.text(max_size=3) | json_values,
        "additionalProperties": st.none() | st.booleans(),
    }
)
text_blocks = objects(
    {
        "type": st.just("text") | st.sampled_from(["image", "resource_link"]) | json_values,
        "text": st.text(max_size=4) | json_values,
        "_meta": st.none() | st.dictionaries(st.text(max_size=3), json_values) | json_values,
        "annotations": json_values,
    }
)
