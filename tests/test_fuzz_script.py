"""Bad script files and bad requests against the scripted model server's parser: a coded
ScriptError or a valid Script, never another exception."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.workbench.scripted.script import Script, ScriptError, parse_script, step_of_request

CODES = {"script_unreadable", "script_syntax", "script_field", "bad_request", "script_exhausted"}
VALID = {"version": 1, "acts": [[{"text": "read", "tool_uses": [{"name": "read_file", "input": {"path": "a"}}]},
                                 {"text": "done", "usage": {"input_tokens": 5}}]], "repeat_last": True}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=25)
field_names = st.sampled_from(["version", "acts", "default", "repeat_last", "text", "tool_uses", "usage",
                               "stop_reason", "name", "input", "input_tokens", "output_tokens", "extra"])
# objects whose keys are mostly the script's own field names, so the checks past the first get reached
script_like = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 3) | st.text(max_size=8) | st.sampled_from(["end_turn", "tool_use"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(field_names, children, max_size=4),
    max_leaves=30)


def parsed_or_coded(text: str):
    try:
        script = parse_script(text)
    except ScriptError as exc:
        assert exc.code in CODES, exc.code
        assert str(exc)
        return exc
    assert isinstance(script, Script)
    for act in script.acts:
        assert act and all(t.text or t.tool_uses for t in act)
    return script


@given(st.text(max_size=300))
def test_random_text_is_a_coded_error_or_a_script(text):
    parsed_or_coded(text)


@given(json_values)
def test_random_json_is_a_coded_error_or_a_script(value):
    parsed_or_coded(json.dumps(value))


@given(script_like)
def test_script_shaped_json_is_a_coded_error_with_a_field_or_a_script(value):
    got = parsed_or_coded(json.dumps(value))
    if isinstance(got, ScriptError) and got.code == "script_field":
        assert got.field, "a field error must name the field"


@given(st.data())
def test_mutated_valid_scripts_are_coded_errors_or_scripts(data):
    text = bytearray(json.dumps(VALID).encode())
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            text[i] ^= 1 << data.draw(st.integers(0, 6))
        elif op == "delete":
            del text[i]
        else:
            text[i:i] = data.draw(st.sampled_from([b"[", b"{", b"]", b",", b'"', b"0", b"null"]))
    parsed_or_coded(text.decode("utf-8", "replace"))


def test_wrong_field_types_name_the_field():
    cases = {"acts": ({"acts": {"a": 1}}, "acts"), "turn": ({"acts": [[5]]}, "acts[0][0]"),
             "usage": ({"acts": [[{"text": "x", "usage": {"input_tokens": -1}}]]}, "acts[0][0].usage.input_tokens"),
             "stop": ({"acts": [[{"text": "x", "stop_reason": "later"}]]}, "acts[0][0].stop_reason"),
             "unknown": ({"acts": [], "mode": 1}, "$")}
    for name, (doc, field) in cases.items():
        with pytest.raises(ScriptError) as info:
            parse_script(json.dumps(doc))
        assert (info.value.code, info.value.field) == ("script_field", field), name


def test_deeply_nested_script_is_a_syntax_error():
    with pytest.raises(ScriptError) as info:
        parse_script('{"acts": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert info.value.code == "script_syntax"


# -- requests: which step a Messages API body asks for -------------------------------------------

content = st.one_of(st.text(max_size=40), st.lists(st.dictionaries(
    st.sampled_from(["type", "text"]), st.sampled_from(["text", "tool_result", "Iteration: 2"]), max_size=2),
    max_size=3), json_values)
bodies = st.one_of(json_values, st.fixed_dictionaries({"messages": st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "x"]), "content": content}),
    json_values), max_size=4)}))


@given(bodies)
def test_random_request_bodies_give_a_step_or_bad_request(body):
    try:
        iteration, turn = step_of_request(body)
    except ScriptError as exc:
        assert exc.code == "bad_request"
    else:
        assert isinstance(iteration, int) and isinstance(turn, int) and turn >= 0


def test_first_line_naming_the_iteration_and_assistant_turns_pick_the_step():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "goal\nIteration: 3\n"}]},
                         {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}
    assert step_of_request(body) == (3, 1)


@pytest.mark.parametrize("first", [{"role": "user", "content": [{"type": "text", "text": 5}]},
                                   {"role": "user", "content": "Iteration: " + "9" * 5000}])
def test_malformed_text_blocks_are_bad_requests(first):
    with pytest.raises(ScriptError) as info:
        step_of_request({"messages": [first]})
    assert info.value.code == "bad_request"
