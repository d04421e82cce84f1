"""The config model: unknown keys, types, key paths with YAML line numbers, JSON Schema."""

from __future__ import annotations

import pytest

from poolctl.config import Config, json_schema, parse_config
from poolctl.errors import UsageError
from tests.configs import pool_yaml


def error_of(text: str) -> str:
    with pytest.raises(UsageError) as e:
        parse_config(text)
    assert e.value.exit_code == 2
    return str(e.value)


def test_contract_example_parses():
    cfg = parse_config(pool_yaml())
    pool = cfg.pools[0]
    assert pool.serving.tensor_parallel == 2 and pool.aws.instance_type == "p5.48xlarge"
    assert pool.clouds == ["aws", "gcp"]


def test_unknown_key_names_path_and_line():
    text = pool_yaml().replace("      port: 8000\n", "      port: 8000\n      prot: 9000\n")
    msg = error_of(text)
    # line 19 of the file holds `prot:` (the 19th line of pool_yaml's text)
    line = text.splitlines().index("      prot: 9000") + 1
    assert f"poolctl.yaml:{line}: pools[0].serving.prot: unknown key" in msg


def test_wrong_type_names_the_key():
    msg = error_of(pool_yaml().replace("max_model_len: 16384", "max_model_len: lots"))
    assert "pools[0].serving.max_model_len" in msg and "'lots'" in msg


def test_missing_key():
    msg = error_of(pool_yaml().replace("      layers: 80\n", ""))
    assert "pools[0].model.layers: required key is missing" in msg


def test_bad_literal():
    msg = error_of(pool_yaml(warm_state="sleeping"))
    assert "pools[0].warm_pool.state" in msg and "'sleeping'" in msg


def test_malformed_yaml_one_line():
    msg = error_of("project: acme\npools: [\n  - name: x\n")
    assert msg.count("\n") == 0 and "not valid YAML" in msg


def test_not_a_mapping():
    assert "expected a mapping" in error_of("- just\n- a list\n")


def test_duplicate_pool_names():
    text = pool_yaml()
    pools = text.split("pools:\n", 1)[1]
    msg = error_of(text + pools)
    assert "used twice" in msg


def test_pool_needs_a_placement():
    text = pool_yaml(with_gcp=False)
    text = text[: text.index("    aws:")]
    assert "needs an `aws:` or a `gcp:` placement" in error_of(text)


def test_bad_pool_name():
    assert "pools[0].name" in error_of(pool_yaml().replace("name: chat-70b", "name: Chat_70B"))


def test_targets_by_cloud():
    cfg = parse_config(pool_yaml(with_gcp=False))
    assert [(p.name, c) for p, c in cfg.targets(None, None)] == [("chat-70b", "aws")]
    with pytest.raises(UsageError, match="--cloud gcp"):
        cfg.targets(None, "gcp")
    with pytest.raises(UsageError, match="--pool: no pool named 'nope'"):
        cfg.targets("nope", None)


def test_every_field_is_described():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            for sub in getattr(ann, "__args__", (ann,)):
                if isinstance(sub, type) and issubclass(sub, Config.__base__) and sub is not model:
                    walk(sub)

    walk(Config)


def test_json_schema_forbids_unknown_keys():
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Serving"]["additionalProperties"] is False
    assert "description" in schema["$defs"]["Serving"]["properties"]["tensor_parallel"]


def test_committed_schema_is_current():
    """`poolctl.schema.json` (for editors: `# yaml-language-server: $schema=...`) is generated
    from the model; regenerate with `poolctl schema --out poolctl.schema.json`."""
    import json
    from pathlib import Path

    committed = Path(__file__).resolve().parents[2] / "poolctl.schema.json"
    assert json.loads(committed.read_text()) == json_schema()
