"""A chat history's messages are checked before any tokenizer runs: an earlier reply's
``token_ids`` belong to an assistant message and are token ids."""

from __future__ import annotations

import pytest

import steer_widgets as sw
from steer_widgets.runtime.tokens import check_prompt

REPLY = {"role": "assistant", "content": "Hi!", "token_ids": [12, 5, 2]}


def test_an_assistant_message_may_carry_its_generated_ids():
    check_prompt([{"role": "user", "content": "Hello"}, REPLY, {"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "message,field",
    [
        ({"role": "user", "content": "Hi", "token_ids": [1]}, "prompt[1].token_ids"),
        ({**REPLY, "token_ids": "12 5"}, "prompt[1].token_ids"),
        ({**REPLY, "token_ids": [1, -2]}, "prompt[1].token_ids[1]"),
        ({**REPLY, "token_ids": [1, True]}, "prompt[1].token_ids[1]"),
        ({**REPLY, "token_ids": [1.0]}, "prompt[1].token_ids[0]"),
        ({**REPLY, "ids": [1]}, "prompt[1]"),
    ],
)
def test_a_malformed_reply_is_named(message, field):
    with pytest.raises(sw.RequestError) as err:
        check_prompt([{"role": "user", "content": "Hello"}, message])
    assert err.value.field == field
