"""data/vllm_releases.yaml against the boot script it describes, and the `vllm-release` rule."""

from __future__ import annotations

import json
import re

import pytest

from poolctl import vllm_releases
from poolctl.bootscript import render_boot_script
from poolctl.cloud import Cloud
from poolctl.commands.init import SERVING_IMAGE
from poolctl.config import parse_config
from poolctl.histograms import (
    TPOT_BUCKETS,
    TPOT_FINE_BUCKETS,
    TTFT_BUCKETS,
    TTFT_FINE_BUCKETS,
    read_back,
)
from poolctl.rules import run_checks
from tests.configs import pool_yaml


def _config(image: str = "vllm/vllm-openai:v0.11.0", prefix_caching: bool = True):
    text = pool_yaml().replace("image: vllm/vllm-openai:v0.11.0", f"image: {image}")
    if not prefix_caching:
        text = text.replace("port: 8000", "port: 8000\n      prefix_caching: false")
    return parse_config(text)


def _serve_flags(script: str) -> set[str]:
    # The server's arguments: what follows the image in the `docker run` line.
    (serve,) = re.findall(r'"\$IMAGE" (--model .*?)>/dev/null', script, re.DOTALL)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", serve))


@pytest.mark.parametrize("cloud", [Cloud.aws, Cloud.gcp])
def test_every_flag_and_metric_the_nodes_use_has_its_release(cloud):
    # the script with every conditional flag: prefix caching off, a release with the
    # custom histogram buckets
    cfg = _config(vllm_releases.releases().default_image, prefix_caching=False)
    script = render_boot_script(cfg, cfg.pools[0], cloud)
    used = _serve_flags(script) | set(re.findall(r"vllm:[a-z0-9_]+", script))
    data = vllm_releases.releases()
    assert used - data.names() == set()  # a new flag or metric: find its first release
    assert data.names() - used == set()  # one no longer used: drop it


def test_the_release_data_is_ordered_and_current():
    data = vllm_releases.releases()
    for need in data.needs:
        assert vllm_releases.parse_release(need.absent_in) < need.release
        assert need.release > vllm_releases.parse_release(data.checked_from)
    default = vllm_releases.image_release(data.default_image)
    assert default is not None and all(n.release <= default for n in data.needs)
    assert SERVING_IMAGE == data.default_image  # `init` writes the default image


@pytest.mark.parametrize(("image", "release"), [
    ("vllm/vllm-openai:v0.34.0", (0, 34, 0)),
    ("vllm/vllm-openai:v0.8.5.post1", (0, 8, 5)),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/vllm-openai:0.10.2-cu128", (0, 10, 2)),
    ("ghcr.io/acme/vllm:v0.11.0@sha256:" + "a" * 64, (0, 11, 0)),
    ("vllm/vllm-openai:latest", None),  # a tag that names no release
    ("vllm/vllm-openai@sha256:" + "b" * 64, None),  # a digest alone
    ("acme/llm-server:v0.8.0", None),  # not a vLLM image: its version says nothing of vLLM
    ("localhost:5000/vllm-openai", None),  # a port, no tag
])
def test_image_release(image, release):
    assert vllm_releases.image_release(image) == release


def _rule(image: str, prefix_caching: bool = True):
    cfg = _config(image, prefix_caching)
    return [f for f in run_checks(cfg, cfg.targets(None, None)) if f.check == "vllm-release"]


def test_an_image_older_than_a_flag_is_warned_naming_the_flag():
    # v0.8.2: before --data-parallel-size (0.8.3), the two metrics (0.10.0, 0.11.0).
    (f,) = _rule("vllm/vllm-openai:v0.8.2")
    assert (f.severity, f.key) == ("warning", "pools[0].serving.image")
    assert "vLLM 0.8.2, which lacks --data-parallel-size (vLLM 0.8.3+" in f.message
    assert "vllm:request_time_per_output_token_seconds (vLLM 0.11.0+" in f.message
    assert "fail to start the server" in f.message
    assert f.hint.startswith("use vLLM 0.11.0 or newer")


def test_a_release_missing_only_a_metric_serves_without_it():
    (f,) = _rule("vllm/vllm-openai:v0.10.2")
    assert "lacks vllm:request_time_per_output_token_seconds" in f.message
    assert "--" not in f.message.split("lacks", 1)[1]
    assert "their agent reports nothing for it" in f.message


def test_the_prefix_caching_flag_counts_only_when_the_script_passes_it():
    # 0.6.4 has no --no-enable-prefix-caching (0.6.5): it matters with prefix caching off.
    on, off = _rule("vllm/vllm-openai:v0.6.4"), _rule("vllm/vllm-openai:v0.6.4", False)
    assert "--no-enable-prefix-caching" not in on[0].message
    assert "--no-enable-prefix-caching (vLLM 0.6.5+" in off[0].message


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.34.0",
                                   "vllm/vllm-openai:latest", "acme/server:v0.1.0"])
def test_current_or_unknown_releases_are_not_warned(image):
    assert _rule(image) == []


@pytest.mark.parametrize(("image", "fine"), [
    ("vllm/vllm-openai:v0.34.0", True), ("vllm/vllm-openai:v0.32.0", True),
    ("vllm/vllm-openai:v0.31.0", False),  # before --custom-histogram-buckets
    ("vllm/vllm-openai:latest", False),  # a release unknown: a flag it may refuse stays out
])
def test_the_boot_script_gives_poolctls_edges_to_a_vllm_that_takes_them(image, fine):
    cfg = _config(image)
    flags = re.findall(r"--custom-histogram-buckets '([^']*)'",
                       render_boot_script(cfg, cfg.pools[0], Cloud.aws))
    assert vllm_releases.fine_edges(image) is fine
    if fine:
        (value,) = flags
        assert json.loads(value) == {"time_to_first_token": list(TTFT_FINE_BUCKETS),
                                     "inter_token_latency": list(TPOT_FINE_BUCKETS)}
    else:
        assert flags == []


@pytest.mark.parametrize(("edges", "vllm", "lo", "hi"), [
    (TPOT_FINE_BUCKETS, TPOT_BUCKETS, 0.005, 0.25),  # TPOTs of interactive serving
    (TTFT_FINE_BUCKETS, TTFT_BUCKETS, 0.05, 5.0),  # TTFTs an SLO is set on
])
def test_poolctls_edges_are_at_most_10_percent_apart_where_slos_are(edges, vllm, lo, hi):
    assert all(b > a for a, b in zip(edges, edges[1:], strict=False))
    dense = [e for e in edges if lo <= e <= hi]
    assert dense[0] == lo and dense[-1] == hi
    assert max(b / a for a, b in zip(dense, dense[1:], strict=False)) <= 1.1 + 1e-9
    # vLLM's own edges outside, and no other
    assert [e for e in edges if not lo <= e <= hi] == [e for e in vllm if not lo <= e <= hi]


def test_a_ttft_p90_read_back_from_poolctls_edges_is_within_10_percent():
    # 40 TTFTs evenly over 0.20..0.24 s, 60 over 0.52..0.56 s: p90 (nearest rank, the 90th)
    # is the 50th of the 60, 0.52 + 49 x 0.04 / 59 = 0.55322 s.
    # vLLM's edges: 40 in (0.1, 0.25], 60 in (0.5, 0.75], which holds over half, so the agent
    # narrows it around its mean: (41.2 s total - 40 x 0.175) / 60 = 0.57 s, to (0.5, 0.64],
    # 10 points 0.014 apart; the 90th request is the 9th point, 0.5 + 8.5 x 0.014 = 0.619 s,
    # +11.9 %. poolctl's edges: 1 + 19 + 20 in (0.19, 0.2], (0.2, 0.22], (0.22, 0.24]; 45 in
    # (0.5, 0.55], 15 in (0.55, 0.6]; none holds half: 10 points each; 40 + 45 = 85 before
    # (0.55, 0.6], whose points weigh 1.5: the 4th reaches 91, 0.55 + 3.5 x 0.005 = 0.5675 s,
    # +2.6 %.
    ttfts = ([0.20 + i * 0.04 / 39 for i in range(40)]
             + [0.52 + i * 0.04 / 59 for i in range(60)])
    true = sorted(ttfts)[89]
    assert true == pytest.approx(0.55322, abs=1e-5)
    coarse = read_back(ttfts, TTFT_BUCKETS, 0.9)
    fine = read_back(ttfts, TTFT_FINE_BUCKETS, 0.9)
    assert coarse == pytest.approx(0.619, abs=1e-5)
    assert fine == pytest.approx(0.5675, abs=1e-5)
    assert coarse / true - 1 > 0.10 and abs(fine / true - 1) <= 0.10


def test_a_tpot_p90_read_back_from_poolctls_edges_is_within_10_percent():
    # 180 requests' TPOTs evenly over 27..29 ms, 20 over 44..46 ms (a few slow ones): p90
    # (nearest rank, the 180th) = 29 ms. vLLM's edges hold all 200 in (25, 50] ms; the agent
    # narrows that bucket around the mean (29.7 ms) to (25, 34.4] and spreads it over 10
    # points 0.94 ms apart: the 180th request is the 9th point, 25 + 8.5 x 0.94 = 32.99 ms,
    # +13.8 %. poolctl's edges split 27..29 ms at 28 ms: the 180th is the last point of
    # (28, 30] ms, 28 + 9.5 x 0.2 = 29.9 ms, +3.1 %.
    tpots = ([0.027 + i * 0.002 / 179 for i in range(180)]
             + [0.044 + i * 0.002 / 19 for i in range(20)])
    true = sorted(tpots)[179]
    assert true == pytest.approx(0.029)
    coarse = read_back(tpots, TPOT_BUCKETS, 0.9)
    fine = read_back(tpots, TPOT_FINE_BUCKETS, 0.9)
    assert coarse == pytest.approx(0.03299, abs=1e-5)
    assert fine == pytest.approx(0.0299, abs=1e-5)
    assert coarse / true - 1 > 0.10 and abs(fine / true - 1) <= 0.10
