"""A pool whose GPUs are slower than its model believes: the sandbox's engines step 1.5x the
serving model's time (`sandbox start --engine-slowdown 1.5`). What the nodes publish makes
status's drift line appear; `perf fit --pool` finds the slowdown in the pool's own histograms;
once its factors are written, the prediction matches again and the line goes.

(The engine at the model's own speed raises no drift line: test_sandbox_https.py.)"""

from __future__ import annotations

import json
import time

import pytest

from tests.plugins.sandbox import run_poolctl, terraform_missing
from tests.serving.pool import AZURE, KEY, KEY_VAR, serving, serving_pool, wait_for_targets

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(terraform_missing() is not None,
                                                  reason=str(terraform_missing()))]
SPEED = 5.0  # as test_sandbox_https.py: CI's load magnified by the speed stays small
SLOWDOWN = 1.5


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    with serving_pool(tmp_path_factory.mktemp("slow-home"), SPEED, engine_slowdown=SLOWDOWN,
                      min_replicas=8, max_replicas=8, warm=0, down_s=7200) as pool:
        wait_for_targets(pool["url"], 2)
        assert serving(pool["url"])["engine_slowdown"] == SLOWDOWN
        yield pool


def _status(pool) -> dict:
    r = run_poolctl(pool["home"], "status", "--sandbox", "-f", str(pool["cfg"]), "--cloud",
                    "aws", "--window", "6", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["pools"][0]


def test_the_drift_line_appears_and_perf_fit_finds_the_slowdown(slow):
    # Five minutes of the Azure conversation trace (about 1,400 requests) through the load
    # balancer to both nodes.
    r = run_poolctl(slow["home"], "replay", "--sandbox", "-f", str(slow["cfg"]), "--cloud",
                    "aws", "--trace", str(AZURE), "--duration", "5m", "--api-key-env",
                    KEY_VAR, "--json", timeout=600, **{KEY_VAR: KEY})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["errors"] == {} and out["completed"] == out["requests"] > 1000
    time.sleep(7)  # the nodes' last interval published (every 5 wall seconds)

    # The model believes the GPUs 1.5x faster than they are: both p90s past the prediction
    # by more than DRIFT_WARN (25 %), and the line names the command that fits the pool.
    pool = _status(slow)
    print("slowed: measured", pool["serving"], "predicted", pool["predicted"],
          "drift", pool["drift"])
    assert min(pool["drift"].values()) > 0.25, pool["drift"]
    r = run_poolctl(slow["home"], "status", "--sandbox", "-f", str(slow["cfg"]), "--cloud",
                    "aws", "--window", "6")
    assert r.returncode == 0, r.stderr
    assert "drift: measured TTFT p90" in r.stdout and (
        f"`poolctl perf fit --cloud aws -f {slow['cfg']} --pool chat-70b --sandbox`"
        in r.stdout), r.stdout

    # perf fit --pool: the factors from the pool's own histograms. The fitted model's decode
    # step at the observed load is the engine's: 1.5x the current model's, within 10 %
    # (measured: x1.52 on a quiet machine, x1.49 beside a test run on both cores). Prefill
    # (from TTFT) within 20 %: the replay's client sends late, then in bursts, when the
    # machine is busy, and the burst's wait is TTFT the fit's Poisson arrivals put on the
    # prefill (measured: x1.58 quiet, x1.73 busy; TTFT's mean +11 % busy, TPOT's +0.4 %;
    # x1.88 and x1.93 in two fresh-clone CI runs of stop 50, with either TTFT timing of the
    # stand-in). Hence 35 % for prefill; the slowdown itself is held by decode, within 10 %.
    r = run_poolctl(slow["home"], "perf", "fit", "--sandbox", "-f", str(slow["cfg"]),
                    "--cloud", "aws", "--window", "6", "--json", "--write", timeout=600)
    assert r.returncode == 0, r.stderr
    fit = json.loads(r.stdout)
    print("perf fit --pool:", json.dumps(fit))
    ratio = fit["engine_vs_model"]
    assert ratio["decode"] == pytest.approx(SLOWDOWN, rel=0.10), ratio
    assert ratio["prefill"] == pytest.approx(SLOWDOWN, rel=0.35), ratio
    assert fit["replicas"] == 8 and fit["requests"] == pytest.approx(out["requests"], abs=5)
    [errs] = fit["errors"].values()
    assert max(abs(v) for v in errs.values()) < 0.10, errs
    assert "perf:" in slow["cfg"].read_text() and fit["written"]

    # Written: the prediction is now the slowed engine's; no drift line.
    pool = _status(slow)
    print("after the fit: predicted", pool["predicted"], "drift", pool["drift"])
    assert max(abs(v) for v in pool["drift"].values()) <= 0.25, pool["drift"]
