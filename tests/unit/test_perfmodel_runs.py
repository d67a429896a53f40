"""The performance model against upstream's published A2 runs (issue 48, item 2): fitted on the
fitting half (perf_fit.fit), judged on the held-out half by the issue's bounds. A model test: the
figures are the model's, in simulated time; nothing here is timed."""

from __future__ import annotations

import pytest

from ascend_fleet.sizing import perf_fit, perfmodel
from ascend_fleet.sizing.perf_runs import load_runs

FITTING, HELD_OUT = load_runs().halves()


@pytest.fixture(scope="module")
def fitted():
    return perf_fit.fit(FITTING)


@pytest.fixture(scope="module")
def every_run():
    """Every run as the model every caller uses (perfmodel.CALIBRATED) predicts it."""
    return [perf_fit.compare(run, perfmodel.CALIBRATED) for run in load_runs().runs]


@pytest.fixture(scope="module")
def held_out(every_run):
    ids = {run.id for run in HELD_OUT}
    comparisons = [comparison for comparison in every_run if comparison.run.id in ids]
    print(f"\n{perfmodel.CALIBRATED}\n" + perf_fit.table(comparisons, perf_fit.halves_by_id()))
    return comparisons


def test_the_fit_gives_every_fitted_term(fitted):
    # deterministic too: the next test holds it equal to the constants an earlier run of it wrote
    assert fitted.layer_seconds_full_decode > 0 and fitted.layer_seconds_piecewise > fitted.layer_seconds_full_decode
    assert fitted.sequence_layer_seconds > 0 and 0 < fitted.compute <= 1
    # the fitting half holds one measured eager run (EvalScope's Qwen2.5-7B): its per-layer cost comes out
    # above the graph modes', as capturing the graph is meant to save
    assert fitted.layer_seconds_eager > fitted.layer_seconds_piecewise


def test_the_model_every_caller_uses_is_the_fit_to_three_figures(fitted):
    for name, value in vars(perfmodel.CALIBRATED).items():
        assert value == pytest.approx(getattr(fitted, name), rel=5e-3), name


def test_only_the_held_out_run_whose_precision_is_unknown_goes_unpredicted(held_out):
    assert [c.run.id for c in held_out if c.reason] == ["minimax-m2.5-tutorial-a2-tp8-dp2-c4-in190k"]


# Not met, and no term the fitting half supports meets it (perf_fit.main prints the figures):
# - compute alone (bisected to the fitting half's two TTFTs, Qwen2.5-72B 1024-token prompts x1.50 and Qwen2.5-7B
#   50-token prompts x0.67 at 0.255) predicts the held-out 2.37x (Qwen3-8B, 10 ShareGPT prompts), 2.70x
#   (Qwen2.5-14B, 12 x 16K prompts) and 0.74x (Llama-3.1-8B, 200 prompts);
# - compute with a fixed cost per request (scheduling, tokenization, sampling), both fitted on those two runs:
#   0.40 and 50 ms fit them within 3 %, and predict the held-out 1.97x, 1.81x and 0.50x;
# - the held-out runs pull apart by themselves: Qwen3-8B needs compute >= 0.5 and Qwen2.5-14B >= 0.57, the
#   fitting half's only long prefill (the 72B) 0.40, Llama-3.1-8B <= 0.29 as V1 chunked prefill schedules it
#   (about 0.63 if scheduled unchunked, as its release's default V0 engine would: vllm-ascend v0.8.5rc1,
#   ec27af346a, docs/source/user_guide/release_notes.md line 5 "you can enable V1 egnine by setting ...
#   VLLM_USE_V1=1", user_guide/suppoted_features.md line 9 "Chunked Prefill | WIP (V0)").
TTFT_MISSES = pytest.mark.xfail(strict=True, reason=(
    "held-out closed-loop TTFTs predicted 2.37x, 2.70x, 0.74x the published; no term fitted on the fitting half's "
    "two TTFT runs brings them within 35 % (compute + a fixed per-request cost: 1.97x, 1.81x, 0.50x)"))


@pytest.mark.parametrize("name", ["tpot_ms", "output_throughput_tok_s", pytest.param("ttft_ms", marks=TTFT_MISSES)])
def test_held_out_runs_are_predicted_within_the_issues_bounds(held_out, name):
    ratios = perf_fit.held_out_ratios(held_out)[name]
    assert ratios, f"no held-out run publishes {name}"
    assert len(perf_fit.within(ratios, name)) >= perf_fit.BOUND_SHARE * len(ratios), (
        f"{name}: {len(perf_fit.within(ratios, name))} of {len(ratios)} held-out runs within "
        f"{perf_fit.BOUNDS[name]:.0%}; ratios " + ", ".join(f"{ratio:.2f}" for ratio in ratios))


def test_the_error_band_plan_prints_is_the_held_out_runs(held_out):
    computed = perf_fit.held_out_ratios(held_out)
    assert computed.keys() == perfmodel.HELD_OUT_RATIOS.keys()
    for name, ratios in computed.items():
        assert perfmodel.HELD_OUT_RATIOS[name] == pytest.approx(ratios, abs=0.005), name


def test_the_docs_page_shows_what_the_generator_gives(every_run):
    page = perf_fit.DOCS_PAGE.read_text()
    generated = perf_fit.page_section(every_run, perf_fit.halves_by_id())
    assert generated in page, "docs/sim-performance.md is stale: python -m ascend_fleet.sizing.perf_fit --write-docs"
    assert all(f"`{comparison.run.id}`" in generated for comparison in every_run)
    assert perf_fit.CHART.exists() and perf_fit.CHART.name in generated


def test_the_chart_is_drawn_from_the_held_out_ratios(tmp_path):
    pytest.importorskip("matplotlib")  # the extra `chart`; the page's table does not need it
    path = tmp_path / "chart.png"
    perf_fit.draw_chart(perfmodel.HELD_OUT_RATIOS, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
