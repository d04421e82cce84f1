"""Sizing arithmetic, every expected number worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest

from poolctl.catalog import load_catalog
from poolctl.config import parse_config
from poolctl.sizing import NodeCounts, kv_bytes_per_token, plan_pool, start_phases
from tests.configs import pool_yaml


def test_llama70b_kv_per_token_is_327680():
    # 2 (K and V) x 80 layers x 8 KV heads x 128 head dim x 2 bytes (bf16) = 327,680 B
    cfg = parse_config(pool_yaml())
    assert kv_bytes_per_token(cfg.pools[0]) == 327_680


def test_llama70b_on_p5_tp2():
    p = plan_pool(parse_config(pool_yaml()).pools[0], "aws")
    assert (p.gpus_per_node, p.tensor_parallel, p.replicas_per_node) == (8, 2, 4)
    # 70.6e9 params x 2 B = 141.2e9 B, split over 2 GPUs = 70.6e9 B per GPU
    assert p.weights_bytes == 141_200_000_000
    assert p.weights_bytes_per_gpu == 70_600_000_000
    # H100 80GB: 81,920 MiB = 85,899,345,920 B; x 0.92 = 79,027,398,246 B (floored)
    assert p.hbm_bytes_per_gpu == 85_899_345_920
    assert p.usable_hbm_bytes_per_gpu == 79_027_398_246
    # KV room per GPU: 79,027,398,246 - 70,600,000,000 - 2 GiB (2,147,483,648) = 6,279,914,598
    assert p.kv_cache_bytes_per_gpu == 6_279_914_598
    # each GPU holds 8 / 2 = 4 KV heads: 2 x 80 x 4 x 128 x 2 = 163,840 B per token per GPU
    assert p.kv_cache_bytes_per_token_per_gpu == 163_840
    # 6,279,914,598 // 163,840 = 38,329 tokens; // 16,384 = 2 full-length sequences
    assert p.kv_cache_tokens_per_replica == 38_329
    assert p.max_concurrent_sequences_per_replica == 2
    # min 4 / 4 = 1 node, max 24 / 4 = 6, warm 8 / 4 = 2, surge 4 / 4 = 1
    assert p.nodes == NodeCounts(min=1, max=6, warm=2, surge=1)
    # replicas are whole nodes x 4 per node: 4 / 24 / 8 / 4
    assert p.replicas == NodeCounts(min=4, max=24, warm=8, surge=4)
    # quota: (6 max + 1 surge + 0 running warm) x 192 vCPU = 1,344
    assert p.to_json()["quota"] == {"name": "L-417A185B", "unit": "vCPU", "needed": 1344,
                       "region": "us-east-1"}
    # decode floor: 70.6e9 B / 3.35e12 B/s = 21.07 ms
    assert p.decode_step_floor_ms == pytest.approx(21.07, abs=0.01)


def test_cost_uses_catalog_price_and_running_warm_nodes():
    cfg = parse_config(pool_yaml(warm_state="running"))
    p = plan_pool(cfg.pools[0], "aws")
    price = load_catalog().get("aws", "p5.48xlarge").price.usd_per_hour
    # running warm nodes are billed: min = (1 + 2) nodes, max = (6 + 2) nodes
    assert p.cost_per_hour_usd == {"min": round(3 * price, 2), "max": round(8 * price, 2)}
    # and counted against the running-instance quota: (6 + 1 + 2) x 192 = 1,728
    assert p.quota.needed == 1728


def test_price_override():
    cfg = parse_config(pool_yaml(extra_aws="      price_per_hour_usd: 10.0\n"))
    p = plan_pool(cfg.pools[0], "aws")
    assert p.cost_per_hour_usd == {"min": 10.0, "max": 60.0}


def test_replicas_round_up_to_whole_nodes():
    # 5 replicas at 4 per node -> 2 nodes = 8 replicas
    p = plan_pool(parse_config(pool_yaml(min_replicas=5)).pools[0], "aws")
    assert p.nodes.min == 2 and p.replicas.min == 8


def test_gcp_quotas_in_gpus():
    p = plan_pool(parse_config(pool_yaml()).pools[0], "gcp")
    names = {q.name: q.needed for q in p.quotas}
    row = load_catalog().get("gcp", "a3-highgpu-8g")
    assert row.regions["us-central1"] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    # a regional MIG surges by 0 or at least one VM per zone: 1 surge node -> 3 (3 zones)
    assert p.nodes.surge == 3
    # (6 max + 3 surge) nodes x 8 H100 = 72 GPUs; 9 x vCPUs; 9 x 16 x 375 GB local SSD
    assert names["NVIDIA_H100_GPUS"] == 72
    assert names["GPUS_ALL_REGIONS"] == 72
    assert names["CPUS"] == 9 * row.vcpus
    assert names["LOCAL_SSD_TOTAL_GB"] == 9 * 16 * 375
    assert p.quota.name == "NVIDIA_H100_GPUS"


def test_fp8_weights_keep_bf16_kv():
    cfg = parse_config(pool_yaml(dtype="fp8"))
    pool = cfg.pools[0]
    # fp8 weights: 70.6e9 x 1 B; KV stays 2 bytes under kv_cache_dtype auto
    assert plan_pool(pool, "aws").weights_bytes == 70_600_000_000
    assert kv_bytes_per_token(pool) == 327_680


def test_start_phases_cold_vs_stopped_warm():
    pool = parse_config(pool_yaml()).pools[0]
    row = load_catalog().get("aws", "p5.48xlarge")
    ph = start_phases(pool, row)
    # image 12 GB at 0.1 GB/s = 120 s cold, none when warm (on the EBS root already)
    assert ph["cold"]["image"] == 120.0 and ph["warm_stopped"]["image"] == 0.0
    # weights 141.2e9 B over min(3200, 100) Gbit/s x 0.25 = 3.125e9 B/s = 45.2 s, both ways:
    # a stopped node's NVMe comes back empty
    assert ph["cold"]["weights_to_nvme"] == 45.2 == ph["warm_stopped"]["weights_to_nvme"]
    # load: max(141.2e9 / (8 x 2e9), 70.6e9 / 2e9) = max(8.8, 35.3) = 35.3 s
    assert ph["cold"]["load_to_gpu"] == 35.3
    assert ph["warm_running"] == {"register": 30}


def test_streamed_weights_skip_the_nvme_but_each_replica_reads_its_own_copy():
    """aws.weights_load: stream. Nothing waits for NVMe; each replica streams the whole
    checkpoint through the node's one object-store rate (3.125e9 B/s, above), the copy to HBM
    overlapping it; the rule weights-load compares the two ways."""
    from poolctl.cloud import Cloud
    from poolctl.rules import run_checks
    from poolctl.sizing import weights_seconds

    row = load_catalog().get("aws", "p5.48xlarge")
    stream = "      weights_load: stream\n"
    tp2 = parse_config(pool_yaml(with_gcp=False, extra_aws=stream)).pools[0]
    tp8 = parse_config(pool_yaml(tp=8, with_gcp=False, extra_aws=stream)).pools[0]
    # TP 2, 4 replicas: 4 x 141.2e9 / 3.125e9 = 180.7 s; fetch 45.2 + 35.3 (above)
    assert weights_seconds(tp2, row) == pytest.approx((0.0, 4 * 141.2e9 / 3.125e9))
    assert weights_seconds(tp2, row, "fetch") == pytest.approx((45.184, 35.3))
    # TP 8, 1 replica: 141.2e9 / 3.125e9 = 45.2 s against HBM's 17.65e9 / 2e9 = 8.8 s;
    # fetch: 45.2 + max(141.2e9 / 16e9, 8.8) = 45.2 + 8.8
    assert weights_seconds(tp8, row) == pytest.approx((0.0, 45.184))
    assert sum(weights_seconds(tp8, row, "fetch")) == pytest.approx(45.184 + 8.825)
    ph = start_phases(tp8, row)
    assert ph["cold"]["weights_to_nvme"] == 0 and ph["cold"]["load_to_gpu"] == 45.2
    assert ph["warm_stopped"]["load_to_gpu"] == 45.2

    def said(text: str) -> list[tuple[str, str]]:
        cfg = parse_config(text)
        return [(f.severity, f.message) for f in run_checks(cfg, cfg.targets(None, Cloud.aws))
                if f.check == "weights-load"]

    [(sev, msg)] = said(pool_yaml(with_gcp=False, extra_aws=stream))
    assert sev == "warning" and "~181 s to GPU memory, where fetch takes ~80 s" in msg
    assert said(pool_yaml(tp=8, with_gcp=False, extra_aws=stream)) == []
    [(sev, msg)] = said(pool_yaml(tp=8, with_gcp=False))  # fetch, where streaming saves 9 s
    assert sev == "info" and "~45 s, fetch takes ~54 s" in msg
    assert said(pool_yaml(with_gcp=False)) == []  # fetch, the faster way for TP 2
    # auto: the faster by these sums, said in one line; what the stack and the boot script use
    from poolctl.sizing import weights_path

    auto = "      weights_load: auto\n"
    tp2_auto = parse_config(pool_yaml(with_gcp=False, extra_aws=auto)).pools[0]
    tp8_auto = parse_config(pool_yaml(tp=8, with_gcp=False, extra_aws=auto)).pools[0]
    assert (weights_path(tp2_auto, row), weights_path(tp8_auto, row)) == ("fetch", "stream")
    assert start_phases(tp8_auto, row)["cold"]["weights_to_nvme"] == 0
    [(sev, msg)] = said(pool_yaml(tp=8, with_gcp=False, extra_aws=auto))
    assert sev == "info" and msg == ("auto: the nodes stream the weights (~45 s to GPU memory; "
                                     "fetch ~54 s)")


def test_node_counts_times_and_json_order():
    n = NodeCounts(min=1, max=6, warm=2, surge=3)
    # 3 replicas per node: 1x3, 6x3, 2x3, 3x3
    assert n.times(3) == NodeCounts(min=3, max=18, warm=6, surge=9)
    assert n.times(1) == n
    # `plan --json` has always listed min, max, warm, surge in this order
    assert list(n.to_json().items()) == [("min", 1), ("max", 6), ("warm", 2), ("surge", 3)]


def test_plan_json_keeps_node_and_replica_dicts():
    p = plan_pool(parse_config(pool_yaml()).pools[0], "aws")
    out = json.loads(json.dumps(p.to_json()))
    # min 4 / max 24 / warm 8 replicas / surge 4 at 4 per node -> 1 / 6 / 2 / 1 nodes
    assert list(out["nodes"].items()) == [("min", 1), ("max", 6), ("warm", 2), ("surge", 1)]
    assert list(out["replicas"].items()) == [("min", 4), ("max", 24), ("warm", 8), ("surge", 4)]


def test_warm_running_nodes_only_when_running():
    running = plan_pool(parse_config(pool_yaml(warm_state="running")).pools[0], "aws")
    stopped = plan_pool(parse_config(pool_yaml()).pools[0], "aws")
    # warm 8 replicas / 4 per node = 2 nodes, held running only in the running state
    assert (running.warm_running_nodes, stopped.warm_running_nodes) == (2, 0)


def test_a_shared_compile_cache_takes_torch_compile_out_of_the_start():
    """engine_init 90 s (ENGINE_INIT_S) holds torch.compile's 60 (COMPILE_S); a pool that
    shares its compile cache counts the cache's 15 (COMPILE_HIT_S) instead: 45 s, cold and
    warm stopped starts 45 s shorter; the first node's miss is what compile_miss_s says."""
    from poolctl.cloud import Cloud
    from poolctl.errors import UsageError
    from poolctl.sizing import compile_miss_s

    plain = parse_config(pool_yaml(with_gcp=False)).pools[0]
    shared = parse_config(pool_yaml(
        with_gcp=False, extra_aws="      compile_cache_uri: s3://acme-models/cc/\n")).pools[0]
    a, b = plan_pool(plain, Cloud.aws), plan_pool(shared, Cloud.aws)
    assert a.start_phases["cold"]["engine_init"] == 90
    assert b.start_phases["cold"]["engine_init"] == 90 - 60 + 15
    for kind in ("cold", "warm"):
        assert a.start_seconds[kind] - b.start_seconds[kind] == pytest.approx(45)
    assert (compile_miss_s(plain, Cloud.aws), compile_miss_s(shared, Cloud.aws)) == (0, 45)
    # the nodes write the cache: never where they only read the weights
    for uri in ("s3://acme-models/llama-3.1-70b/cc/", "s3://acme-models/"):
        with pytest.raises(UsageError) as e:
            parse_config(pool_yaml(with_gcp=False,
                                   extra_aws=f"      compile_cache_uri: {uri}\n"))
        assert "compile_cache_uri" in str(e.value) and "overlaps weights_uri" in str(e.value)
