"""What the typed bindings cannot check, checked against the schema they carry.

The prebuilt provider bindings type-check every argument a stack passes through them, but not
the escape hatches: `add_override` paths, raw `${...}` expressions (references to resources,
their attributes and variables) and overrides of the `terraform` block. Their jsii assembly
(`<package>/_jsii/*.jsii.tgz`, member `package/.jsii`) holds every resource's arguments,
nested blocks, required fields and attributes. The assembly is read as text and only the
types a stack uses are decoded: the whole document is 130 MB of JSON (the AWS one), and the
package root would import ~2,200 modules (25 s).
"""

from __future__ import annotations

import importlib.util
import json
import re
import tarfile
from pathlib import Path

# Terraform's own keys of a resource / data block, not the provider's.
META_ARGUMENTS = {"//", "count", "depends_on", "for_each", "lifecycle", "provider",
                  "connection", "provisioner"}
PROVIDERS = {  # Terraform provider name -> (Python package, jsii assembly, class prefix)
    "aws": ("cdktn_provider_aws", "@cdktn/provider-aws", "Aws"),
    "google": ("cdktn_provider_google", "@cdktn/provider-google", "Google"),
}


def snake(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


def camel(snake_name: str) -> str:
    head, *rest = snake_name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


class Assembly:
    """One jsii assembly, decoding a type only when asked for it."""

    def __init__(self, package: str) -> None:
        spec = importlib.util.find_spec(package)  # finds the package without running it
        assert spec and spec.submodule_search_locations, f"{package} is not installed"
        (tgz,) = Path(spec.submodule_search_locations[0], "_jsii").glob("*.jsii.tgz")
        with tarfile.open(tgz) as tf:
            member = tf.extractfile("package/.jsii")
            assert member is not None
            self.text = member.read().decode()
        self.types_at = self.text.index('"types":')
        self._decoder = json.JSONDecoder()
        self._types: dict[str, dict | None] = {}

    def type(self, fqn: str) -> dict | None:
        if fqn not in self._types:
            key = f'"{fqn}":'
            at = self.text.find(key, self.types_at)
            if at < 0:
                self._types[fqn] = None
            else:
                at += len(key)
                while self.text[at] in " \n\r\t":
                    at += 1
                self._types[fqn] = self._decoder.raw_decode(self.text, at)[0]
        return self._types[fqn]

    def known(self, fqn: str) -> dict:
        """A type the assembly has (its fqn found by a lookup that checked)."""
        t = self.type(fqn)
        assert t is not None, fqn
        return t


def _tf_name(prop: dict) -> str:
    """A property's Terraform name: the registry anchor in its docs, else its snake case."""
    docs = prop.get("docs") or {}
    m = re.search(r"#(\w+) \w+#", f"{docs.get('summary', '')} {docs.get('remarks', '')}")
    return m.group(1) if m else snake(prop["name"])


def _struct(asm: Assembly, ref: dict) -> tuple[str | None, bool]:
    """(the struct's fqn, whether it comes as a list) of a property type, or (None, False)
    for a primitive, a map or a class."""
    if "union" in ref:
        for t in ref["union"]["types"]:
            fqn, many = _struct(asm, t)
            if fqn:
                return fqn, many
        return None, False
    if "collection" in ref:
        if ref["collection"]["kind"] != "array":
            return None, False
        fqn, _ = _struct(asm, ref["collection"]["elementtype"])
        return fqn, True
    fqn = ref.get("fqn")
    t = asm.type(fqn) if fqn and not fqn.startswith("cdktn.") else None
    return (fqn, False) if t and t.get("datatype") else (None, False)


def _props(asm: Assembly, fqn: str) -> dict[str, dict]:
    t = asm.type(fqn)
    assert t is not None, fqn
    return {_tf_name(p): p for p in t.get("properties", [])}


def _is_token(value) -> bool:
    return isinstance(value, str) and value.startswith("${")


class ProviderSchema:
    def __init__(self, provider: str) -> None:
        package, self.name, self.prefix = PROVIDERS[provider]
        self.provider = provider
        self.asm = Assembly(package)

    def block_fqn(self, kind: str, tf_type: str, suffix: str = "Config") -> str | None:
        """The bindings' config struct (or with suffix "" the construct class) of a resource
        or data source type; None when the provider has no such type."""
        if kind == "data":
            ns = camel(tf_type.replace(f"{self.provider}_", f"data_{self.provider}_", 1))
        else:
            ns = camel(tf_type.removeprefix(f"{self.provider}_"))
        fqn = f"{self.name}.{ns}.{ns[:1].upper()}{ns[1:]}{suffix}"
        return fqn if self.asm.type(fqn) else None

    def provider_fqn(self) -> str:
        return f"{self.name}.provider.{self.prefix}ProviderConfig"

    def check_body(self, fqn: str, body: dict, path: str, top: bool = True) -> list[str]:
        """Every key of `body` an argument or block of `fqn` (recursively), every required
        argument present."""
        props = _props(self.asm, fqn)
        problems = []
        for key, value in body.items():
            if top and key in META_ARGUMENTS:
                continue
            if key not in props:
                problems.append(f"{path}.{key}: not an argument or block of "
                                f"{fqn.rsplit('.', 1)[-1]}")
                continue
            sub, _ = _struct(self.asm, props[key]["type"])
            if sub is None or _is_token(value):
                continue
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if isinstance(item, dict):
                    where = f"{path}.{key}" + (f"[{i}]" if isinstance(value, list) else "")
                    problems += self.check_body(sub, item, where, top=False)
        for key, p in props.items():
            if not p.get("optional") and key not in body:
                problems.append(f"{path}: required argument {key} is missing")
        return problems

    def attributes(self, kind: str, tf_type: str) -> set[str]:
        """Attributes of a resource/data source (what `TYPE.NAME.ATTR` may read)."""
        fqn = self.block_fqn(kind, tf_type, suffix="")
        return set() if fqn is None else {snake(p["name"]) for p in
                                          self.asm.known(fqn).get("properties", [])}

    def element_attributes(self, kind: str, tf_type: str, attr: str) -> set[str] | None:
        """Attributes of one element of a list attribute (what `for s in X.ATTR : s.A` may
        read), or None when ATTR is not a list of objects."""
        cls = self.block_fqn(kind, tf_type, suffix="")
        prop = next((p for p in self.asm.known(cls).get("properties", [])
                     if snake(p["name"]) == attr), None) if cls else None
        lst = self.asm.type(prop["type"].get("fqn", "")) if prop else None
        get = next((m for m in (lst or {}).get("methods", []) if m["name"] == "get"), None)
        if get is None:
            return None
        elem = self.asm.known(get["returns"]["type"]["fqn"])
        return {snake(p["name"]) for p in elem.get("properties", [])}


# `${...}` not escaped as `$${`; references inside one.
_REF = re.compile(r"(?<![\w.])(data\.)?((?:aws|google)_[a-z0-9_]+)\.([A-Za-z0-9_-]+)"
                  r"(?:\[[^\]]*\])?\.([a-z0-9_]+)")
_VAR = re.compile(r"(?<![\w.])var\.([A-Za-z0-9_-]+)")
_FOR = re.compile(r"\bfor (\w+) in (data\.)?((?:aws|google)_[a-z0-9_]+)\.[A-Za-z0-9_-]+"
                  r"\.([a-z0-9_]+)\s*:(.*)$", re.S)
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def expressions(text: str) -> list[str]:
    """The `${...}` expressions of a Terraform JSON string (`$${` is a literal)."""
    out, i = [], 0
    while (i := text.find("${", i)) >= 0:
        if i > 0 and text[i - 1] == "$":
            i += 2
            continue
        depth, j = 0, i + 1
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        out.append(text[i + 2:j])
        i = j
    return out


def _strings(node, path: str):
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")


def check_stack(doc: dict, schemas: dict[str, ProviderSchema], backend: Assembly) -> list[str]:
    """Every escape hatch of a synthesized stack against the bindings' schema: each block's
    arguments (an `add_override` lands there), the provider blocks, the terraform block,
    and every reference inside a raw expression. Returns the problems found."""
    problems: list[str] = []
    tf = doc.get("terraform", {})
    for name, req in tf.get("required_providers", {}).items():
        if name not in schemas or req.get("source") != f"hashicorp/{name}":
            problems.append(f"terraform.required_providers.{name}: not hashicorp/{name}")
    for kind, settings in tf.get("backend", {}).items():
        cfg = backend.type(f"cdktn.{kind[:1].upper()}{kind[1:]}BackendConfig")
        known = {snake(p["name"]) for p in (cfg or {}).get("properties", [])}
        for key in set(settings) - known:
            problems.append(f"terraform.backend.{kind}.{key}: not a {kind} backend argument")
    for name, blocks in doc.get("provider", {}).items():
        schema = schemas.get(name)
        if schema is None:
            problems.append(f"provider.{name}: no bindings for this provider")
            continue
        for i, body in enumerate(blocks):
            problems += schema.check_body(schema.provider_fqn(), body, f"provider.{name}[{i}]")
    for kind in ("resource", "data"):
        for tf_type, items in doc.get(kind, {}).items():
            schema = schemas.get(tf_type.split("_", 1)[0])
            fqn = schema.block_fqn(kind, tf_type) if schema else None
            if schema is None or fqn is None:
                problems.append(f"{kind}.{tf_type}: not a type of the provider's bindings")
                continue
            for name, body in items.items():
                problems += schema.check_body(fqn, body, f"{kind}.{tf_type}.{name}")
    variables = set(doc.get("variable", {}))
    for path, text in _strings(doc, ""):
        path = path.lstrip(".")
        for expr in expressions(text):
            code = _QUOTED.sub('""', expr)
            for var in _VAR.findall(code):
                if var not in variables:
                    problems.append(f"{path}: var.{var} is not declared")
            for data, tf_type, name, attr in _REF.findall(code):
                kind = "data" if data else "resource"
                schema = schemas.get(tf_type.split("_", 1)[0])
                if name not in doc.get(kind, {}).get(tf_type, {}):
                    problems.append(f"{path}: {data}{tf_type}.{name} is not in the stack")
                elif schema is None or attr not in schema.attributes(kind, tf_type):
                    problems.append(f"{path}: {data}{tf_type}.{name}.{attr} is not an "
                                    f"attribute of {tf_type}")
            if m := _FOR.search(code):
                local, data, tf_type, attr, rest = m.groups()
                schema = schemas[tf_type.split("_", 1)[0]]
                elem = schema.element_attributes("data" if data else "resource", tf_type, attr)
                for used in re.findall(rf"(?<![\w.]){local}\.([a-z0-9_]+)", rest):
                    if elem is None or used not in elem:
                        problems.append(f"{path}: {local}.{used} is not an attribute of an "
                                        f"element of {tf_type}.{attr}")
    return problems
