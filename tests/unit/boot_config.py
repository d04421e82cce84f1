"""The hand-written config the boot-script tests render: an AWS p5.48xlarge pool with
tensor_parallel 2 (4 replicas per node) and a GCP a3-highgpu-8g pool with tensor_parallel 8
(1 replica per node, image in Artifact Registry)."""

from __future__ import annotations

import json
import re

from poolctl.config import Config, parse_config

# Arguments a shell would mangle if they were not quoted: JSON, a quote, $( ), backticks.
EXTRA_ARGS = [
    "--override-generation-config",
    '{"temperature": 0.6, "top_p": 0.9}',
    "--chat-template-content-format=openai",
    "it's $(touch /tmp/poolctl-pwned) `id` \"x\" * ;",
]

CONFIG_YAML = """\
project: acme
pools:
  - name: chat-70b
    model:
      id: meta-llama/Llama-3.1-70B-Instruct
      version: "2024-07"
      params_b: 70.6
      dtype: bfloat16
      layers: 80
      kv_heads: 8
      head_dim: 128
    serving:
      image: vllm/vllm-openai:v0.11.0
      tensor_parallel: 2
      max_model_len: 16384
      gpu_memory_utilization: 0.92
      max_num_batched_tokens: 8192
      port: 8000
      extra_args: EXTRA_ARGS_JSON
    scaling: {min_replicas: 4, max_replicas: 24, queue_target: 4}
    warm_pool: {replicas: 8, state: stopped}
    aws:
      region: us-east-1
      instance_type: p5.48xlarge
      weights_uri: s3://acme-models/llama-3.1-70b
  - name: llama-405b
    model:
      id: meta-llama/Llama-3.1-405B-Instruct-FP8
      params_b: 405
      dtype: fp8
      layers: 126
      kv_heads: 8
      head_dim: 128
    serving:
      image: us-docker.pkg.dev/acme-prod/serving/vllm-openai:v0.11.0
      tensor_parallel: 8
      max_model_len: 8192
      port: 8080
    scaling: {min_replicas: 1, max_replicas: 4}
    gcp:
      project: acme-prod
      region: us-central1
      machine_type: a3-highgpu-8g
      weights_uri: gs://acme-models/llama-3.1-405b-fp8/
"""


def config_yaml(aws_port: int = 8000, gcp_port: int = 8080, image: str | None = None,
                api_key_secret: str | None = None, compile_cache: bool = False,
                stream: bool = False) -> str:
    text = CONFIG_YAML.replace("EXTRA_ARGS_JSON", json.dumps(EXTRA_ARGS))
    if stream:  # the AWS pool's engine streams its weights (aws.weights_load)
        text = text.replace("      weights_uri: s3://acme-models/llama-3.1-70b\n",
                            "      weights_uri: s3://acme-models/llama-3.1-70b\n"
                            "      weights_load: stream\n")
    if compile_cache:  # both pools share a torch.compile cache beside their weights
        text = text.replace("      weights_uri: s3://acme-models/llama-3.1-70b\n",
                            "      weights_uri: s3://acme-models/llama-3.1-70b\n"
                            "      compile_cache_uri: s3://acme-models/compile-cache/\n")
        text = text.replace("      weights_uri: gs://acme-models/llama-3.1-405b-fp8/\n",
                            "      weights_uri: gs://acme-models/llama-3.1-405b-fp8/\n"
                            "      compile_cache_uri: gs://acme-models/compile-cache/\n")
    if api_key_secret:  # an ARN for the AWS pool (first), a secret name for the GCP one
        ports = list(re.finditer(r"\n      port: \d+\n", text))
        at = ports[0 if api_key_secret.startswith("arn:") else 1].end()
        text = f"{text[:at]}      api_key_secret: {api_key_secret}\n{text[at:]}"
    text = text.replace("port: 8000", f"port: {aws_port}")
    text = text.replace("port: 8080", f"port: {gcp_port}")
    if image:
        text = text.replace("image: vllm/vllm-openai:v0.11.0", f"image: {image}")
    return text


def load(**kw) -> Config:
    return parse_config(config_yaml(**kw))
