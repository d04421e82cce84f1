"""A parametrized pool config for unit tests (the contract's example by default)."""

from __future__ import annotations


def pool_yaml(
    *,
    tp: int = 2,
    min_replicas: int = 4,
    max_replicas: int = 24,
    warm: int = 8,
    warm_state: str = "stopped",
    surge: int = 4,
    dtype: str = "bfloat16",
    params_b: float = 70.6,
    max_model_len: int = 16384,
    instance_type: str = "p5.48xlarge",
    machine_type: str = "a3-highgpu-8g",
    region: str = "us-east-1",
    down_s: int = 900,
    up_s: int = 0,
    utilization: float = 0.6,
    checkpoints: str = "[25, 50, 100]",
    extra_aws: str = "",
    extra_gcp: str = "",
    with_gcp: bool = True,
) -> str:
    text = f"""\
project: acme
pools:
  - name: chat-70b
    model:
      id: meta-llama/Llama-3.1-70B-Instruct
      params_b: {params_b}
      dtype: {dtype}
      layers: 80
      kv_heads: 8
      head_dim: 128
    serving:
      image: vllm/vllm-openai:v0.11.0
      tensor_parallel: {tp}
      max_model_len: {max_model_len}
      gpu_memory_utilization: 0.92
      max_num_batched_tokens: 8192
      port: 8000
    scaling:
      min_replicas: {min_replicas}
      max_replicas: {max_replicas}
      queue_target: 4
      scale_up_stabilization_s: {up_s}
      scale_down_stabilization_s: {down_s}
    warm_pool:
      replicas: {warm}
      state: {warm_state}
    rollout:
      max_surge_replicas: {surge}
      checkpoints: {checkpoints}
    slo:
      ttft_p90_s: 2.0
      target_utilization: {utilization}
    aws:
      region: {region}
      instance_type: {instance_type}
      weights_uri: s3://acme-models/llama-3.1-70b/
{extra_aws}"""
    if with_gcp:
        text += f"""\
    gcp:
      project: acme-prod
      region: us-central1
      machine_type: {machine_type}
      weights_uri: gs://acme-models/llama-3.1-70b/
{extra_gcp}"""
    return text


def with_second_pool(text: str, *, name: str = "chat-b", max_replicas: int = 8,
                     warm: int = 4, warm_state: str = "running", aws_region: str | None = None,
                     gcp_project: str | None = None) -> str:
    """`text` (a one-pool `pool_yaml`) plus a copy of its pool renamed and resized: a
    second pool of the same file, drawing on the same quotas unless moved to another AWS
    region or GCP project."""
    import re

    head, block = text.split("pools:\n", 1)
    b = block.replace("  - name: chat-70b\n", f"  - name: {name}\n", 1)
    b = re.sub(r"max_replicas: \d+", f"max_replicas: {max_replicas}", b, count=1)
    b = re.sub(r"(warm_pool:\n\s+replicas: )\d+(\n\s+state: )\w+", rf"\g<1>{warm}\g<2>"
               + warm_state, b, count=1)
    if aws_region:
        b = re.sub(r"(\n    aws:\n      region: )\S+", rf"\g<1>{aws_region}", b, count=1)
    if gcp_project:
        b = b.replace("project: acme-prod", f"project: {gcp_project}", 1)
    return f"{head}pools:\n{block}{b}"
