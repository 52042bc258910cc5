"""Do the samplers sample networks at their temperature? EquilibrationCheck on three small nets.

The nets, data and settings are those of `benchmarks/network_temperatures.py` (scikit-learn's
digits: a 64-50-10 MLP, a Conv2D net and an Embedding + LSTM net; batch 64, prior std 1,
minibatches drawn with replacement). Every run starts from the same warmed-up state (200 epochs
of SGNHT, h = 2e-3, A = 1, except the wrong runs, which start from the initialisation) and is
judged by the strict check (`rtol=0`): post-burn-in means, kinetic and configurational, within
the 99% familywise batch-means band of T.

- mCCAdL at h = 5e-4 holds the whole MLP within 1% of T at T = 1 and at a cold T = 0.3, and
  at h = 2e-3 it is flagged 5% hot. No sampler holds every large variable of these nets within
  the strict band at affordable run lengths; docs/temperature.md states by how much each
  misses, from the benchmark's JSON.
- The wrong runs (a chain at T = 2 checked against T = 1; SGHMC with a large step and no noise
  correction) must be flagged: the check can fail.

All are slow (tens of seconds to minutes each); the default suite tests the check itself in
test_equilibration.py. The figures behind docs/temperature.md's table come from
`python -m benchmarks.network_temperatures` (JSON under benchmarks/results/).
"""

import pytest

from benchmarks import network_temperatures as nt

pytestmark = pytest.mark.slow

WARM_UP_EPOCHS = 200


def _describe(report: dict) -> str:
    return nt.summary_line(report)


@pytest.mark.parametrize("net", ["mlp", "conv", "lstm"])
def test_a_chain_at_twice_the_temperature_is_flagged(net):
    # SGNHT's default warm-up (1000 steps) and the MSER burn-in after it must leave the check its
    # 10 blocks: at 100 epochs (20 blocks) the MLP's and LSTM's burn-in left 8 and no verdict.
    report = nt.run(net, "sgnht", 2.0, epochs=nt.EPOCHS["sgnht"], check_temperature=1.0, warm_up_epochs=0)
    assert report["equilibrated"] is False, _describe(report)
    assert report["overall"]["configurational"]["in_band"] is False, _describe(report)


def test_sghmc_with_a_large_step_in_heavy_noise_is_flagged():
    report = nt.run("mlp", "sghmc-large-step", 1.0, epochs=100)
    assert report["equilibrated"] is False, _describe(report)


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_mccadl_holds_the_whole_mlp_within_one_percent_of_its_temperature(temperature):
    # Whole net only, and deviations under 1% of T accepted (`rtol`): the strict band (about
    # +-0.3% here) flags what remains at this step, measured at +0.3..0.5% (network_temperatures_
    # mlp_warm_h5e-4.json; the slow run of this test saw kinetic 1.003 +- 0.001 at T = 1). Per
    # variable, the logits kernel stays 1.5% (T = 1) to 4.4% (T = 0.3) off (docs/temperature.md).
    # 2400 epochs: at 1200 the burn-in the check chose (MSER) left too short a tail at T = 0.3
    # on one noise stream (configurational 0.293 +- 0.002, flagged); at 2400 it read 0.300-0.301
    # +- 0.001 on both streams tried.
    report = nt.run("mlp", "mccadl", temperature, epochs=2400, step_size=5e-4, warm_up_epochs=WARM_UP_EPOCHS,
                    min_variable_size=10**9, rtol=0.01)
    assert report["equilibrated"] is True, _describe(report)


def test_mccadl_with_a_large_step_runs_the_mlp_hot():
    # The same check at h = 2e-3, where the C step's damping is no longer small in the noisiest
    # directions: the whole net's configurational temperature runs ~5% hot (docs/temperature.md).
    report = nt.run("mlp", "mccadl", 1.0, epochs=300, warm_up_epochs=WARM_UP_EPOCHS, min_variable_size=10**9,
                    rtol=0.01)
    assert report["equilibrated"] is False, _describe(report)
    assert report["overall"]["configurational"]["in_band"] is False, _describe(report)
