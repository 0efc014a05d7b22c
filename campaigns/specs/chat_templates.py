"""A tokenizer's chat template rendered without transformers, as
`tokenizer.apply_chat_template(..., tokenize=False)` renders it: the web
process (the setup page's check, planning's costs) may not import a model
library, and the worker renders through the same function, so both count a
prompt's tokens alike.

The environment is transformers' own (transformers/utils/chat_template_utils.py):
jinja2's immutable sandbox (templates come with a model, untrusted), blocks
trimmed, `loopcontrols`, a `{% generation %}` block that renders its body,
`tojson` without HTML escaping, `raise_exception` and `strftime_now`.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(Extension):
    """`{% generation %}…{% endgeneration %}`: marks an assistant's turn for
    training masks; rendering a prompt needs only its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return environment.from_string(template)


def render(template: str, messages: list[dict], **special_tokens: str) -> str:
    """The conversation with the assistant's cue after it (add_generation_prompt)."""
    return _compiled(template).render(
        messages=messages, add_generation_prompt=True, **special_tokens
    )
