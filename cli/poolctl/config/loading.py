"""Loading: one clear line per problem, with the key path and, where YAML has it, the line;
the file found from -f or the environment; the JSON Schema.
"""

from __future__ import annotations

import os
import re
import stat
import typing
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)
from pydantic_core import ErrorDetails

from poolctl import formats
from poolctl.config.model import Config
from poolctl.config.reader import MAX_FILE_BYTES, format_loc, line_of, read_yaml, shown
from poolctl.config.shapes import CoreModel, Loc
from poolctl.errors import UsageError
from poolctl.models import did_you_mean


@cache
def _union_tags() -> frozenset[str]:
    """What pydantic inserts into error locations for a member of a union: the model's
    class name, or the tag of a discriminated one (Serving.api_key_secret)."""
    names, todo = {"SecretName", "ReservationIds", "ReservationGroup"}, [CoreModel]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return frozenset(names)


def _clean_loc(err: ErrorDetails) -> Loc:
    """The key path of an error, without pydantic's union tags. The last part of an unknown
    key's path is the key itself, whatever it is called."""
    loc = err["loc"]
    keep = len(loc) - 1 if err["type"] == "extra_forbidden" else len(loc)
    return tuple(p for i, p in enumerate(loc)
                 if isinstance(p, int) or i >= keep or p not in _union_tags())


def _file_flag(path: str | os.PathLike[str] | None) -> str:
    """What named the config file, for messages."""
    return "POOLCTL_FILE" if path is None and os.environ.get("POOLCTL_FILE") else "-f/--file"


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as a message shows it: as written, or quoted when it holds a character that
    does not print as itself (a newline in a name must not split the message)."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    return text if formats.hidden_character(text) is None else repr(text)


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is not a config file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder; pass the config file in it (-f FOLDER/poolctl.yaml)"
    kind = next((what for test, what in _KINDS if test(mode)), "a special file")
    return f"is not a regular file ({kind}); pass the config file itself"


def find_config(path: str | os.PathLike[str] | None) -> Path:
    """The config file: `path`, else $POOLCTL_FILE, else ./poolctl.yaml; a regular file
    (a folder, a FIFO or a device is refused here, before anything reads it)."""
    flag = _file_flag(path)
    if path is None:
        path = os.environ.get("POOLCTL_FILE") or "poolctl.yaml"
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(
            f"{flag}: {shown_path(p)} not found; run in a folder with poolctl.yaml, "
            "or pass -f PATH (or set POOLCTL_FILE)"
        ) from None
    except OSError as e:
        raise UsageError(f"{flag}: {shown_path(p)} cannot be read ({e.strerror}); check the "
                         "path and its permissions") from None
    except ValueError:  # a NUL byte: only an environment or a caller can pass one
        raise UsageError(f"{flag}: {shown_path(p)} is not a usable path; check it") from None
    if problem := _not_regular(mode):
        raise UsageError(f"{flag}: {shown_path(p)} {problem}")
    return p


def parse_config(text: str, source: str = "poolctl.yaml") -> Config:
    data, lines = read_yaml(text, source)
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping with `project` and `pools` at the top")
    try:
        # model.config_json is relative to the file that names it
        cfg = Config.model_validate(data, context={"base_dir": Path(source).parent})
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = _clean_loc(err)
            line = line_of(lines, loc)
            where = f"{source}:{line}" if line else source
            msgs.append(f"{where}: {format_loc(loc) or '(top)'}: {_hint(err)}")
        raise UsageError("\n".join(msgs)) from None
    cfg._source, cfg._lines = source, lines
    return cfg


# pydantic's error kinds, in plain words ({...} from the error's context).
_PLAIN = {
    "greater_than": "must be more than {gt}",
    "greater_than_equal": "must be {ge} or more",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be {le} or less",
    "finite_number": "must be a finite number",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text (quote it)",
    "list_type": "must be a list ([a, b] or '- ' lines)",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "too_short": "needs at least {min_length} item(s)",
    "too_long": "takes at most {max_length} item(s)",
    "string_too_short": "must be at least {min_length} character(s)",
    "string_too_long": "must be at most {max_length} characters",
}


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The config model class that holds the key at `loc` (for the keys it allows)."""
    cls: type[BaseModel] | None = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) if cls else None
        if field is None:
            return None
        stack, cls = [field.annotation], None
        while stack:  # the first model class inside list[...] / X | None / Annotated[...]
            t = stack.pop(0)
            if isinstance(t, type) and issubclass(t, BaseModel):
                cls = t
                break
            stack += list(typing.get_args(t))
    return cls


def _hint(err: ErrorDetails) -> str:

    kind, value = err["type"], err.get("input")
    got = f"; got {shown(value)}" if "input" in err else ""
    if kind == "extra_forbidden":
        loc = _clean_loc(err)
        cls = _model_at(loc)
        maybe = did_you_mean(str(loc[-1]), list(cls.model_fields)) if cls else ""
        return f"unknown key{maybe}; remove it or fix its spelling (keys: `poolctl schema`)"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        maybe = did_you_mean(str(value), choices) if isinstance(value, str) else ""
        return f"must be one of {expected}{maybe}{got}"
    if kind == "string_pattern_mismatch":
        return f"{shown(value)} must be lowercase letters, digits and '-' (max 40)"
    if kind in ("int_type", "float_type") and isinstance(value, bool):
        return f"must be a number, not true/false{got}"
    if kind in _PLAIN:
        # a float field's bound reads as written in the model (1000, not 1000.0)
        ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v
               for k, v in err.get("ctx", {}).items()}
        return _PLAIN[kind].format(**ctx) + got
    msg = re.sub(r"^(Value|Assertion) error, ", "", err["msg"])
    if kind == "invalid" and (shown(value) in msg or str(value) in msg):
        return msg  # the message quotes the value already
    return msg + got


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    flag = _file_flag(path)
    p = find_config(path)
    source = shown_path(path or p)
    try:
        # O_NONBLOCK: were the file swapped for a FIFO since find_config, the open would wait
        # for a writer; fstat then says what was opened, and only a regular file is read.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"{flag}: {source} cannot be read ({e.strerror}); check the path "
                         "and its permissions") from None
    with os.fdopen(fd, "rb") as fh:
        if problem := _not_regular(os.fstat(fd).st_mode):
            raise UsageError(f"{flag}: {source} {problem}")
        try:
            raw = fh.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise UsageError(f"{flag}: {source} cannot be read ({e.strerror}); check the "
                             "file") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UsageError(f"{source}: over {MAX_FILE_BYTES // 2**20} MiB, too large for a pool "
                         "config; check that -f names the right file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UsageError(f"{source}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); save "
                         "the file as UTF-8") from None
    return parse_config(text, source=source)


def json_schema() -> dict[str, Any]:
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "poolctl.yaml"
    return schema
