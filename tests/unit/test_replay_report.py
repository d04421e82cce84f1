"""`replay`'s report from measured outcomes (numbers worked by hand), and the endpoint's
`try: curl` line with a sandbox's certificate."""

from __future__ import annotations

import pytest

from poolctl.inventory import Endpoint
from poolctl.replay import Outcome, ReplayRun, as_sent, report
from poolctl.traces import Trace


def _run() -> ReplayRun:
    run = ReplayRun("https://127.0.0.1:1", "m", speed=10.0, trace_s=10.0)
    # (ttft, e2e, output tokens, headers): pool seconds
    for i, (ttft, e2e, out, hdr) in enumerate([(0.2, 2.2, 11, 0.02), (0.4, 4.4, 21, 0.01),
                                               (1.0, 3.0, 5, 0.03), (0.6, 1.6, 3, 0.05)]):
        run.outcomes.append(Outcome(i, float(i), 100, out, ttft_s=ttft, e2e_s=e2e,
                                    output_tokens=out, headers_s=hdr))
    run.outcomes.append(Outcome(4, 4.0, 100, 10, error="http 503"))
    return run


def test_overhead_is_the_median_round_trip_to_the_headers_over_ttft_p90():
    rep = report(_run(), ttft_slo_s=0.5, tpot_slo_s=0.3)
    # headers 0.01, 0.02, 0.03, 0.05: median 0.025. TTFT 0.2, 0.4, 0.6, 1.0: p90 by linear
    # interpolation at rank 2.7 = 0.6 + 0.7 x 0.4 = 0.88.
    assert rep.overhead_s == pytest.approx(0.025)
    assert rep.ttft_s.p90 == pytest.approx(0.88)
    assert rep.overhead_share == pytest.approx(0.025 / 0.88)
    # TPOT: 2.0/10 = 0.2, 4.0/20 = 0.2, 2.0/4 = 0.5, 1.0/2 = 0.5; within TTFT 0.5 and TPOT
    # 0.3: the first two; of five sent (the 503 counts against it): 40 %.
    assert rep.goodput == pytest.approx(0.4)
    assert rep.errors == {"http 503": 1} and rep.completed == 4
    j = rep.to_json()
    assert j["overhead_s"] == rep.overhead_s and j["overhead_share"] == rep.overhead_share


def test_the_contracts_failed_and_slo():
    # TTFT p90 0.88 (above); TPOT 0.2, 0.2, 0.5, 0.5: p90 at rank 2.7 = 0.5.
    j = report(_run(), ttft_slo_s=1.0, tpot_slo_s=0.3).to_json()
    assert j["requests"] == 5 and j["failed"] == 1
    # TTFT 0.88 <= 1.0 is met, TPOT 0.5 > 0.3 is not: the SLO is missed. Goodput: TTFT <= 1.0
    # and TPOT <= 0.3, the first two of five.
    assert j["slo"] == {"ttft_p90_s": 1.0, "tpot_p90_s": 0.3, "met": False, "goodput": 0.4,
                        "ttft_met": True, "tpot_met": False}
    assert report(_run(), ttft_slo_s=0.9).to_json()["slo"]["met"] is True  # no TPOT target
    assert report(_run(), ttft_slo_s=0.8).to_json()["slo"]["met"] is False
    # no SLO given: the keys are there, with nothing judged
    none = report(_run()).to_json()["slo"]
    assert none["met"] is None and none["goodput"] is None


def test_ttft_less_each_requests_own_round_trip():
    rep = report(_run())
    # TTFT - headers: 0.2 - 0.02 = 0.18, 0.4 - 0.01 = 0.39, 1.0 - 0.03 = 0.97,
    # 0.6 - 0.05 = 0.55; sorted 0.18, 0.39, 0.55, 0.97: p50 at rank 1.5 = 0.47, p90 at rank
    # 2.7 = 0.55 + 0.7 x 0.42 = 0.844 (not 0.88 - 0.025: each request less its own).
    assert rep.server_ttft_s is not None
    assert rep.server_ttft_s.p50 == pytest.approx(0.47)
    assert rep.server_ttft_s.p90 == pytest.approx(0.844)
    assert rep.to_json()["server_ttft_s"]["p90"] == pytest.approx(0.844)
    # a request with no headers time (or failed) has none
    assert Outcome(0, 0.0, 1, 1, ttft_s=0.1, e2e_s=0.2, output_tokens=1).server_ttft_s is None


def test_no_completed_request_has_no_overhead():
    run = ReplayRun("http://127.0.0.1:1", "m", speed=1.0, trace_s=1.0)
    run.outcomes.append(Outcome(0, 0.0, 10, 10, error="connect"))
    rep = report(run)
    assert rep.overhead_s is None and rep.overhead_share is None
    assert rep.server_ttft_s is None and rep.to_json()["server_ttft_s"] is None


def test_the_curl_line_trusts_the_sandboxs_certificate():
    ep = Endpoint("https", "127.0.0.1", 40443, internal=False, api_key_secret="arn:secret",
                  ca_file="/home/u/.poolctl/sandbox/balancers/acme chat/ca.pem")
    assert ep.curl() == ("curl -sS --cacert '/home/u/.poolctl/sandbox/balancers/acme chat/"
                         "ca.pem' -H \"Authorization: Bearer $VLLM_API_KEY\" "
                         "https://127.0.0.1:40443/v1/models")
    plain = Endpoint("http", "lb.example", 80)
    assert plain.curl() == "curl -sS http://lb.example/v1/models"


def test_compare_runs_the_model_on_the_requests_as_the_client_sent_them():
    # A trace of four requests 1 s apart; the client sent the second and third late (a busy
    # loop), together at 2.5 s, and was interrupted before the fourth.
    trace = Trace("t", [0.0, 1.0, 2.0, 3.0], [10, 20, 30, 40], [1, 2, 3, 4])
    run = ReplayRun("http://127.0.0.1:1", "m", speed=5.0, trace_s=4.0)
    for i, sent in enumerate([0.0, 2.5, 2.5]):
        run.outcomes.append(Outcome(i, trace.arrivals[i], trace.inputs[i], trace.outputs[i],
                                    sent_s=sent))
    got = as_sent(trace, run)
    assert (got.arrivals, got.inputs, got.outputs) == ([0.0, 2.5, 2.5], [10, 20, 30], [1, 2, 3])
    # late by 0, 1.5 and 0.5 s: p90 by linear interpolation at rank 1.8 = 0.5 + 0.8 x 1.0
    assert report(run).send_lag_s == pytest.approx(1.3)
    assert report(run).to_json()["send_lag_s"] == pytest.approx(1.3)
