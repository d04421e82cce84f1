"""Strings from outside poolctl reach Terraform as literals, never as expressions.

Terraform reads every string of a `.tf.json` file as a template: `${...}` interpolates and
`%{...}` runs a directive (file(), env reads...). A config value copied in raw is therefore
code. The stacks only ever see `literal_view(cfg)`, where every string is escaped
(`${` -> `$${`, `%{` -> `%%{`, what cdktf's `Fn.rawString` does for `${`); Terraform turns
the escapes back into the original text. Terraform's literal-only places (variable defaults,
backend settings) must get the raw value: `PoolStack.raw_pool` / `raw_cfg`. A value inside
one of poolctl's own expressions goes in as `hcl_quoted(view_value)`.
"""

from __future__ import annotations

from typing import TypeVar, cast

from pydantic import BaseModel

T = TypeVar("T")


def escape(text: str) -> str:
    """`text` as a Terraform template whose value is `text`."""
    return text.replace("${", "$${").replace("%{", "%%{")


def literal_view(value: T) -> T:
    """A copy of `value` (a config model, list, dict or str) with every string escaped.

    model_construct: no re-validation (an escaped value need not pass the schema again), and
    unlike model_copy no cached derived value (a `cached_property` computed from the raw
    strings) comes along: derived values are computed again from the escaped fields.
    """
    if isinstance(value, str):
        return cast(T, escape(value))
    if isinstance(value, BaseModel):
        view = type(value).model_construct(
            _fields_set=value.model_fields_set,
            **{k: literal_view(getattr(value, k)) for k in type(value).model_fields})
        if value.__pydantic_private__:  # e.g. where each model field came from (a preset)
            view.__pydantic_private__ = dict(value.__pydantic_private__)
        return view
    if isinstance(value, list | tuple):
        return type(value)(literal_view(v) for v in value)
    if isinstance(value, dict):
        return cast(T, {literal_view(k): literal_view(v) for k, v in value.items()})
    return value


def hcl_quoted(text: str) -> str:
    """A literal-view string (already template-escaped) as an HCL string literal inside one
    of poolctl's own `${...}` expressions: quotes, backslashes and control characters
    escaped (HCL knows no `\\b`/`\\f`, hence no json.dumps)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
