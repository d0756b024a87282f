"""jinja2 configured like HF transformers' apply_chat_template: the oracle that kiln's Jinja engine
and chat layer are compared with (test_jinja_oracle.py, test_chat_context.py)."""
import json
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment


class _Generation(Extension):
    """HF's AssistantTracker without tracking: {% generation %}…{% endgeneration %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen", []), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def hf_environment(now: datetime, immutable: bool = True) -> SandboxedEnvironment:
    """ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols, {% generation %},
    HF's tojson and raise_exception, and strftime_now answering for `now`. immutable=False gives
    SandboxedEnvironment instead (list/dict mutators allowed): kiln's default, as llama-server."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    cls = ImmutableSandboxedEnvironment if immutable else SandboxedEnvironment
    env = cls(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env
