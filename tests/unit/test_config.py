"""The config model: unknown keys, types, key paths with YAML line numbers, JSON Schema."""

from __future__ import annotations

import pytest

from poolctl.cloud import Cloud
from poolctl.config import Config, Target, json_schema, parse_config
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
    msg = error_of(pool_yaml().replace("      image: vllm", "      imag: vllm"))
    assert "pools[0].serving.image: required key is missing; add it" in msg


ARCH = "      params_b: 70.6\n      dtype: bfloat16\n      layers: 80\n      kv_heads: 8\n" \
    "      head_dim: 128\n"


def test_preset_fills_the_model():
    text = pool_yaml()
    assert ARCH in text
    model = parse_config(text.replace(ARCH, "")).pools[0].model
    # meta-llama/Llama-3.1-70B-Instruct's config.json, by hand
    assert (model.params_b, model.dtype, model.layers, model.attention_heads, model.kv_heads,
            model.head_dim) == (70.6, "bfloat16", 80, 64, 8, 128)
    assert model.source_of("layers") == "preset"


def test_explicit_fields_override_the_preset():
    text = pool_yaml().replace(ARCH, "      dtype: fp8\n")
    model = parse_config(text).pools[0].model
    assert model.dtype == "fp8" and model.source_of("dtype") == "file"
    assert model.layers == 80 and model.source_of("layers") == "preset"


def test_unknown_model_without_fields_suggests_a_preset():
    text = pool_yaml().replace(ARCH, "").replace("Llama-3.1-70B-Instruct",
                                                 "Llama-3.1-70B-Instuct")
    msg = error_of(text)
    line = text.splitlines().index("      id: meta-llama/Llama-3.1-70B-Instuct") + 1
    assert msg.count("\n") == 0
    assert msg.startswith(f"poolctl.yaml:{line}: pools[0].model.id: no preset for "
                          "'meta-llama/Llama-3.1-70B-Instuct' (did you mean "
                          "'meta-llama/Llama-3.1-70B-Instruct'?)"), msg


def test_unknown_model_with_every_field_is_fine():
    text = pool_yaml().replace("meta-llama/Llama-3.1-70B-Instruct", "acme/own-70b")
    assert parse_config(text).pools[0].model.layers == 80


def test_config_json_fills_the_model(tmp_path):
    import json

    # Llama-3.1-8B's config.json (the keys poolctl reads)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}))
    text = pool_yaml().replace(ARCH, "      config_json: m/config.json\n").replace(
        "meta-llama/Llama-3.1-70B-Instruct", "acme/own-8b")
    model = parse_config(text, source=str(tmp_path / "poolctl.yaml")).pools[0].model
    # embeddings 2 x 128256 x 4096 = 1,050.6 M; per layer q,o 2 x 4096^2 + k,v 2 x 4096 x 1024
    # + MLP 3 x 4096 x 14336 + 2 norms = 218.1 M, x 32 = 6,979.3 M; total 8.03 B (the card's)
    assert (model.params_b, model.layers, model.attention_heads, model.kv_heads,
            model.head_dim, model.dtype) == (8.03, 32, 32, 8, 128, "bfloat16")
    assert model.source_of("params_b") == "config.json"
    given = text.replace("      config_json:", "      params_b: 8.0\n      config_json:")
    model = parse_config(given, source=str(tmp_path / "poolctl.yaml")).pools[0].model
    assert model.params_b == 8.0 and model.source_of("params_b") == "file"


def test_config_json_missing_or_bad(tmp_path):
    text = pool_yaml().replace(ARCH, "      config_json: nope.json\n")
    msg = error_of(text)
    assert "pools[0].model.config_json: nope.json cannot be read" in msg
    (tmp_path / "c.json").write_text('{"num_hidden_layers": 4}')
    msg = error_of(text.replace("nope.json", str(tmp_path / "c.json")).replace(
        "meta-llama/Llama-3.1-70B-Instruct", "acme/x"))
    assert "pools[0].model.config_json:" in msg and "model.params_b" in msg
    (tmp_path / "c.json").write_text('{"num_hidden_layers": 61, "kv_lora_rank": 512}')
    msg = error_of(text.replace("nope.json", str(tmp_path / "c.json")))
    assert "multi-head latent attention" in msg and msg.count("\n") == 0


def test_plain_words_and_did_you_mean():
    msg = error_of(pool_yaml().replace("queue_target: 4", "queu_target: 4"))
    assert "pools[0].scaling.queu_target: unknown key (did you mean 'queue_target'?)" in msg
    msg = error_of(pool_yaml(warm_state="stoped"))
    assert "(did you mean 'stopped'?); got 'stoped'" in msg
    msg = error_of(pool_yaml().replace("max_model_len: 16384", "max_model_len: 0"))
    assert msg.endswith("pools[0].serving.max_model_len: must be more than 0; got 0")
    assert "Input should" not in error_of(pool_yaml().replace("params_b: 70.6", "params_b: x"))


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
    assert cfg.targets(None, None) == [Target(cfg.pools[0], Cloud.aws)]
    with pytest.raises(UsageError, match="--cloud gcp"):
        cfg.targets(None, "gcp")
    with pytest.raises(UsageError, match="--pool: no pool named 'nope'"):
        cfg.targets("nope", None)


def test_targets_carry_a_cloud_not_a_string():
    cfg = parse_config(pool_yaml())
    both = cfg.targets(None, None)
    # one pool with both placements: aws first (the order of Cloud), then gcp
    assert [(t.pool.name, t.cloud) for t in both] == [("chat-70b", "aws"), ("chat-70b", "gcp")]
    assert all(type(t.cloud) is Cloud for t in both)
    # a --cloud given as the plain word becomes the enum at the edge
    (only,) = cfg.targets("chat-70b", "gcp")
    assert only.cloud is Cloud.gcp


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


# --- strings from outside, parsed once (poolctl.formats) --------------------------------

from poolctl import formats  # noqa: E402


@pytest.mark.parametrize(("uri", "scheme", "parts"), [
    ("s3://acme-models/llama-3.1-70b/", "s3", ("acme-models", "llama-3.1-70b/")),
    ("s3://acme-models/llama-3.1-70b", "s3", ("acme-models", "llama-3.1-70b/")),
    ("s3://acme.models/a/b=1/c+d/", "s3", ("acme.models", "a/b=1/c+d/")),
    ("s3://acme-models/", "s3", ("acme-models", "")),
    ("s3://acme-models", "s3", ("acme-models", "")),
    ("gs://acme_models/x/", "gs", ("acme_models", "x/")),
    ("gs://a.b.c/x/", "gs", ("a.b.c", "x/")),
])
def test_weights_uri_parts(uri, scheme, parts):
    p = formats.parse_object_prefix(uri, scheme)
    assert (p.scheme, p.bucket, p.prefix) == (scheme, *parts)
    assert p.uri == f"{scheme}://{parts[0]}/{parts[1]}"


@pytest.mark.parametrize(("uri", "scheme"), [
    ("s3://*/", "s3"), ("s3://acme-models/*", "s3"), ("s3://acme-models/a?/", "s3"),
    ("s3://ab/", "s3"), ("s3://" + "a" * 64 + "/", "s3"), ("s3://a..b/x/", "s3"),
    ("s3://-acme/x/", "s3"), ("s3://acme_models/x/", "s3"), ("s3://xn--acme/x/", "s3"),
    ("s3://acme--x-s3/x/", "s3"), ("s3://10.0.0.1/x/", "s3"), ("s3://acme/a//b/", "s3"),
    ("s3://acme/./b/", "s3"), ("s3://acme/${aws:userid}/", "s3"), ("s3://acme/a b/", "s3"),
    ("s3://acme/a'b/", "s3"), ("s3://acme/%{x}/", "s3"), ("gs://acme/x/", "s3"),
    ('gs://acme/x") || true || ("/', "gs"), ("gs://goog-models/x/", "gs"),
    ("gs://my-google-bucket/x/", "gs"), ("gs://Acme/x/", "gs"), ("gs://acme/a\\b/", "gs"),
    ("gs://acme/a\nb/", "gs"), ("gs://" + "a" * 64 + "/x/", "gs"),
])
def test_weights_uri_refused(uri, scheme):
    with pytest.raises(ValueError):
        formats.parse_object_prefix(uri, scheme)


def test_placements_carry_parsed_weights():
    pool = parse_config(pool_yaml()).pools[0]
    assert pool.aws.weights == formats.ObjectPrefix("s3", "acme-models", "llama-3.1-70b/")
    assert pool.gcp.weights == formats.ObjectPrefix("gs", "acme-models", "llama-3.1-70b/")


@pytest.mark.parametrize("ref", [
    "vllm/vllm-openai:v0.11.0", "vllm/vllm-openai", "ubuntu", "library/ubuntu:22.04",
    "ghcr.io/org/team/img:1.2.3-rc_1", "localhost:5000/x:y", "[::1]:5000/x",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/serving/vllm:v0.11.0",
    "us-docker.pkg.dev/acme-prod/serving/vllm-openai:v0.11.0",
    "vllm/vllm-openai@sha256:" + "a" * 64, "vllm/vllm-openai:v1@sha256:" + "0" * 64,
    "a__b/c--d/e.f:T_1",
])
def test_image_references_accepted(ref):
    assert formats.image_reference(ref) == ref


@pytest.mark.parametrize("ref", [
    "", "vllm/OpenAI:v1", "vllm/vllm-openai:", "vllm/vllm-openai:v1; id", "$(id)",
    "vllm/vllm-openai:-v1", "vllm//x", "vllm/x@sha256:abc", "-x/y", "x/y:" + "t" * 129,
    "vllm/vllm-openai:v1\n", "a" * 256 + ":v1", "vllm/${x}:v1", "vllm/x y",
])
def test_image_references_refused(ref):
    with pytest.raises(ValueError, match="image"):
        formats.image_reference(ref)


@pytest.mark.parametrize(("text", "ok"), [
    ("10.0.0.0/8", True), ("0.0.0.0/0", True), ("192.168.1.7/32", True),
    ("10.0.0.1/8", False), ("10.0.0.0/33", False), ("10.0.0.0", False), ("::/0", False),
    ("300.0.0.0/8", False), ("ten/8", False), ("10.0.0.0/8 ", False),
])
def test_ipv4_cidrs(text, ok):
    if ok:
        assert formats.ipv4_cidr(text) == text
    else:
        with pytest.raises(ValueError):
            formats.ipv4_cidr(text)


def test_cel_literals_are_escaped():
    from poolctl_stacks.gcp.iam import cel_string, weights_condition

    assert cel_string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    # Even an ObjectPrefix built around the parser cannot break out of the literal.
    cond = weights_condition(formats.ObjectPrefix("gs", "b", 'x") || true || ("/'))
    assert '"projects/_/buckets/b/objects/x\\") || true || (\\"/"' in cond["expression"]
    assert weights_condition(formats.ObjectPrefix("gs", "b", "")) is None


@pytest.mark.parametrize(("secret", "key"), [
    ("arn:aws:secretsmanager:us-east-1:123456789012:secret:k-AbCdEf",
     "pools[0].serving.api_key_secret"),  # one string, two clouds
    ("{aws: 'arn:aws:s3:::bucket', gcp: k}", "pools[0].serving.api_key_secret.aws"),
    ("{aws: 'arn:aws:secretsmanager:us-east-1:123456789012:secret:k-AbCdEf', gcp: 'k/v'}",
     "pools[0].serving.api_key_secret.gcp"),
    ("{gcp: k}", "pools[0].serving.api_key_secret.aws"),
])
def test_api_key_secret_names_the_key(secret, key):
    text = pool_yaml().replace("      port: 8000\n",
                               f"      port: 8000\n      api_key_secret: {secret}\n")
    assert f"{key}:" in error_of(text)


def test_api_key_secret_per_cloud():
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:k-AbCdEf"
    text = pool_yaml().replace("      port: 8000\n", "      port: 8000\n      api_key_secret: "
                               f"{{aws: '{arn}', gcp: projects/other-proj/secrets/k}}\n")
    pool = parse_config(text).pools[0]
    assert pool.api_key_secret("aws") == arn
    assert pool.api_key_secret("gcp") == "projects/other-proj/secrets/k"
    only_gcp = pool_yaml(with_gcp=True).replace("      port: 8000\n",
                                                "      port: 8000\n      api_key_secret: k\n")
    only_gcp = only_gcp[: only_gcp.index("    aws:")] + only_gcp[only_gcp.index("    gcp:"):]
    assert parse_config(only_gcp).pools[0].api_key_secret("gcp") == (
        "projects/acme-prod/secrets/k")
    assert parse_config(pool_yaml()).pools[0].api_key_secret("aws") is None


@pytest.mark.parametrize(("project", "pool", "key"), [
    ("a" * 40, "b" * 15, "pools[0].name"),  # 56 characters: the flow-log role is 65
    ("internal", "chat", "project"), ("internal-x", "chat", "project"),
    ("1acme", "chat", "project"),
])
def test_names_the_clouds_reject(project, pool, key):
    text = pool_yaml().replace("project: acme\n", f"project: {project}\n", 1).replace(
        "name: chat-70b", f"name: {pool}")
    msg = error_of(text)
    assert f": {key}: " in msg and msg.count("\n") == 0


def test_names_at_the_limit_and_per_cloud():
    ok = pool_yaml().replace("project: acme\n", f"project: {'a' * 40}\n", 1).replace(
        "name: chat-70b", f"name: {'b' * 14}")
    parse_config(ok)  # 55 characters
    # A project starting with a digit is fine where no GCP name is built from it.
    aws_only = pool_yaml(with_gcp=False).replace("project: acme\n", "project: 1acme\n", 1)
    assert parse_config(aws_only).project == "1acme"


@pytest.mark.parametrize("check", [
    lambda v: formats.parse_object_prefix(v, "s3"), formats.image_reference, formats.url_path,
    formats.aws_secret_arn, lambda v: formats.gcp_secret_name(v, "acme-prod"),
])
@pytest.mark.parametrize("value", [
    "s3://acme-models/x\n", "vllm/vllm-openai:v1\n", "/health\n",
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:k-AbCdEf\n", "vllm-key\n",
])
def test_a_trailing_newline_is_not_accepted(check, value):
    """`$` in a Python regex also matches before a final newline: every shape is whole."""
    with pytest.raises(ValueError):
        check(value)


@pytest.mark.parametrize(("extra", "key"), [
    ("      network: 'a/b'\n", "pools[0].gcp.network"),
    ("      network: Default\n", "pools[0].gcp.network"),
    ("      subnetwork: projects/acme-prod/regions/europe-west4/subnetworks/s\n",
     "pools[0].gcp.subnetwork"),
    ("      subnetwork: 'sub net'\n", "pools[0].gcp.subnetwork"),
])
def test_gcp_network_shapes(extra, key):
    """What the GCP stack's network parsing accepts, checked at load (validate == synth)."""
    assert f": {key}: " in error_of(pool_yaml(extra_gcp=extra))


def test_gcp_network_forms_accepted():
    extra = ("      network: projects/host-proj/global/networks/shared\n"
             "      subnetwork: projects/host-proj/regions/us-central1/subnetworks/nodes\n")
    assert parse_config(pool_yaml(extra_gcp=extra)).pools[0].gcp.network.endswith("/shared")


# --- issue 23: real shapes at load -------------------------------------------------------


def test_every_catalog_region_is_a_region():
    """The region shape (every AWS partition's naming) admits each region the catalog
    offers a type in, and the GCP one each GCP region."""
    from poolctl.catalog import load_catalog

    cat = load_catalog()
    for cloud, key in (("aws", "region: us-east-1"), ("gcp", "region: us-central1")):
        for name in cat.names(cloud):
            for region in cat.get(cloud, name).regions:
                assert parse_config(pool_yaml().replace(key, f"region: {region}")), region


@pytest.mark.parametrize("region", ["us-gov-west-1", "cn-northwest-1", "eu-isoe-west-1",
                                    "us-isob-east-1", "eusc-de-east-1", "ap-southeast-5",
                                    "mx-central-1", "il-central-1"])
def test_aws_regions_of_every_partition(region):
    text = "backend:\n  aws: {bucket: acme-state, region: " + region + "}\n" + pool_yaml()
    assert parse_config(text).backend.aws.region == region


@pytest.mark.parametrize(("arn", "ok"), [
    ("arn:aws:acm:us-east-1:123456789012:certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789", True),
    ("arn:aws-us-gov:acm:us-gov-west-1:123456789012:certificate/"
     "0a1b2c3d-4e5f-6789-abcd-ef0123456789", True),
    ("arn:aws:acm:us-east-1:123456789012:certificate/x", False),  # not an id ACM issues
    ("arn:aws:acm:us-east-1:1234:certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789", False),
    ("arn:aws:iam::123456789012:server-certificate/x", False),  # IAM, not ACM
    ("arn:aws:acm:us-east-1:123456789012:certificate/0A1B2C3D-4E5F-6789-ABCD-EF0123456789",
     False),
])
def test_acm_certificate_arn(arn, ok):
    if ok:
        assert formats.acm_certificate_arn(arn) == arn.split(":")[3]
    else:
        with pytest.raises(ValueError, match="not an ACM certificate ARN"):
            formats.acm_certificate_arn(arn)


@pytest.mark.parametrize("image", [
    "common-cu124", "family/common-cu124", "debian-cloud/debian-12",
    "global/images/family/x", "projects/acme-prod/global/images/mine-1",
    "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204",
    "https://www.googleapis.com/compute/v1/projects/acme-prod/global/images/family/x",
])
def test_gcp_image_forms_accepted(image):
    """What an instance template's source image takes (poolctl_stacks.gcp.pool.image_lookup
    reads each)."""
    assert parse_config(pool_yaml(extra_gcp=f"      image: {image}\n")).pools[0].gcp.image == image


@pytest.mark.parametrize(("extra", "key"), [
    ("      image: 'projects/acme-prod/global/images/${var.x}'\n", "pools[0].gcp.image"),
    ("      image: Ubuntu\n", "pools[0].gcp.image"),
    ("      image: 'a b'\n", "pools[0].gcp.image"),
    ("      base_image: 'https://www.googleapis.com/compute/v1/projects/p-1234/global/images/x'\n",
     "pools[0].gcp.base_image"),
    ("      image_builder_type: 'n2 standard'\n", "pools[0].gcp.image_builder_type"),
])
def test_gcp_image_shapes_refused(extra, key):
    assert f": {key}: " in error_of(pool_yaml(extra_gcp=extra))


def test_backend_values_are_literals_of_their_shape():
    ok = ("backend:\n  aws: {bucket: acme.tf-state, region: eu-west-1, key_prefix: a/b, "
          "dynamodb_table: tf_locks.v2}\n  gcp: {bucket: acme_tf.state, prefix: pools}\n")
    cfg = parse_config(ok + pool_yaml())
    assert cfg.backend.aws.dynamodb_table == "tf_locks.v2" and cfg.backend.gcp.prefix == "pools"
    msg = error_of("backend:\n  gcp: {bucket: acme, prefix: '${path.module}'}\n" + pool_yaml())
    assert msg.count("\n") == 0 and "backend.gcp.prefix: Terraform takes no expressions" in msg


@pytest.mark.parametrize(("text", "hidden"), [
    ("v1", None), ("ünï©ødé ✓", None), ("a b", None), ("a\u00a0b", "\u00a0"),
    ("a\x00b", "\x00"), ("\x1b[0m", "\x1b"), ("ab\u202e", "\u202e"), ("\u200b", "\u200b"),
    ("a\u2028b", "\u2028"), ("\ue000", "\ue000"),
])
def test_hidden_characters(text, hidden):
    assert formats.hidden_character(text) == hidden


def test_the_merge_key_once_still_merges():
    """One `<<` per mapping keeps YAML's meaning: the block's keys, the mapping's own win."""
    text = pool_yaml().replace("    serving:\n", "    serving:\n      <<: {max_num_seqs: 64, "
                               "port: 9000}\n")
    serving = parse_config(text).pools[0].serving
    assert (serving.max_num_seqs, serving.port) == (64, 8000)


def test_weights_load_streams_on_aws_only():
    text = pool_yaml(extra_aws="      weights_load: stream\n")
    assert parse_config(text).pools[0].aws.weights_load == "stream"
    assert parse_config(pool_yaml()).pools[0].aws.weights_load == "fetch"  # the default
    msg = error_of(pool_yaml(extra_gcp="      weights_load: stream\n"))
    assert "pools[0].gcp.weights_load: must be one of 'fetch'; got 'stream'" in msg, msg
