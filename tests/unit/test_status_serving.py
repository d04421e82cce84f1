"""`status`'s line of what the engines served (numbers worked by hand)."""

from __future__ import annotations

import pytest

from poolctl.cloud import Cloud
from poolctl.clouds.base import Group, NodeState, PoolStatus, ServingWindow
from poolctl.commands.ops import model_lines, serving_line


def _status(serving: ServingWindow | None) -> PoolStatus:
    group = Group(Cloud.aws, "acme-chat-70b", "us-east-1", 1, 6, 2, 0, "", "1")
    nodes = [NodeState(f"i-{k}", "InService", "in_service") for k in range(2)]
    return PoolStatus(pool="chat-70b", cloud=Cloud.aws, group=group, replicas_per_node=4,
                      nodes=nodes, rollout=None, queue_per_replica=0.0, serving=serving,
                      price_per_node_hour_usd=55.04)


def test_cost_per_million_output_tokens_at_the_observed_rate():
    w = ServingWindow(window_s=600, requests=2880, prompt_tokens=2.9e6, output_tokens=7.2e5,
                      ttft_p50_s=0.21, ttft_p90_s=0.62, tpot_p50_s=0.038, tpot_p90_s=0.044,
                      ttft_slo_s=2.0, tpot_slo_s=0.05, ttft_within=0.991, tpot_within=0.97,
                      kv_usage=0.34)
    # two nodes at $55.04/h for 10 min: $18.347, over 0.72 M output tokens: $25.48 per 1 M
    assert w.usd_per_million_output_tokens(2 * 55.04) == pytest.approx(
        2 * 55.04 / 6 / 0.72)
    line = serving_line(_status(w), 10)
    assert line == ("served (last 10 min): 4.80 req/s, 1,200 output tokens/s; TTFT p50 210 ms, "
                    "p90 620 ms (99.1% within 2.00 s); TPOT p50 38 ms, p90 44 ms (97.0% within "
                    "50 ms); KV cache 34%; $25.48 per 1M output tokens")
    j = _status(w).to_json()["serving"]
    assert j["requests_per_s"] == pytest.approx(4.8)
    assert j["usd_per_million_output_tokens"] == pytest.approx(25.48, abs=0.005)


@pytest.mark.parametrize("w", [None, ServingWindow(600, 0, 0, 0)])
def test_a_pool_without_traffic_says_so(w):
    assert serving_line(_status(w), 10) == (
        "served (last 10 min): no request finished (nothing published, or no traffic)")
    assert ServingWindow(600, 0, 0, 0).usd_per_million_output_tokens(100.0) is None


def test_the_model_line_and_the_drift_line():
    from dataclasses import replace

    from poolctl.clouds.base import ServingPrediction

    w = ServingWindow(window_s=600, requests=2880, prompt_tokens=2.9e6, output_tokens=7.2e5,
                      ttft_p90_s=0.62, tpot_p90_s=0.044)
    s = replace(_status(w), predicted=ServingPrediction(8, 0.5, 0.04))
    # 0.62 / 0.5 - 1 = +24 %, 0.044 / 0.04 - 1 = +10 %: both under the 25 % of DRIFT_WARN
    assert s.drift() == pytest.approx({"ttft": 0.24, "tpot": 0.10})
    assert model_lines(s) == [
        "model (this load on 8 replicas): TTFT p90 500 ms, TPOT p90 40 ms; measured "
        "TTFT +24%, TPOT +10%"]
    slow = replace(s, predicted=ServingPrediction(8, 0.4, 0.04))  # 0.62 / 0.4: +55 %
    hint = "poolctl perf fit --cloud aws --pool chat-70b"
    assert model_lines(slow, hint)[1] == (
        "drift: measured TTFT p90 55% over the serving model's for this load: plan and "
        "simulate size this pool too small; fit the model to the pool: `poolctl perf fit "
        "--cloud aws --pool chat-70b` (docs/metrics.md#fitting-the-model-to-the-pool)")
    assert model_lines(replace(s, predicted=None)) == []
    assert slow.to_json()["drift"]["ttft"] == pytest.approx(0.55)
    # the contract's `live` block carries the same, in its names
    live = slow.to_json()["live"]
    assert set(live) >= {"window_s", "ttft_s", "tpot_s", "requests_per_s",
                         "output_tokens_per_s", "usd_per_1m_output_tokens", "predicted",
                         "drift"}
    assert live["window_s"] == 600 and live["ttft_s"]["p90"] == 0.62
    assert live["tpot_s"]["p90"] == 0.044 and live["requests_per_s"] == pytest.approx(4.8)
    assert live["output_tokens_per_s"] == pytest.approx(1200)
    # two nodes up at $55.04/h for 10 min over 0.72 M output tokens (as above)
    assert live["usd_per_1m_output_tokens"] == pytest.approx(25.48, abs=0.005)
    assert live["predicted"] == {"replicas": 8, "ttft_s": {"p90": 0.4}, "tpot_s": {"p90": 0.04}}
    assert live["drift"]["ttft"] == pytest.approx(0.55)
    assert _status(None).to_json()["live"] is None  # no node publishes


def test_no_drift_is_judged_while_requests_wait():
    from dataclasses import replace

    from poolctl.clouds.base import ServingPrediction

    # A burst on too few nodes: TTFT is queueing (76 s), the model's 0.8 s is for the
    # replicas in service now. The queue says so, and the line says why no drift is judged.
    w = ServingWindow(window_s=600, requests=1900, prompt_tokens=3.8e6, output_tokens=3.8e5,
                      ttft_p90_s=76.5, tpot_p90_s=0.063, queue_per_replica=6.2)
    s = replace(_status(w), predicted=ServingPrediction(20, 0.832, 0.030))
    assert model_lines(s)[1] == (
        "drift: not judged: requests waited (6.2 per replica on average), so this latency "
        "measures the pool's capacity and scaling, not the model")
