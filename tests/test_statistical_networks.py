"""Do the samplers sample networks at their temperature? EquilibrationCheck on three small nets.

The nets, data and settings are those of `benchmarks/network_temperatures.py` (scikit-learn's
digits: a 64-50-10 MLP, a Conv2D net and an Embedding + LSTM net; batch 64, prior std 1,
minibatches drawn with replacement). Every run starts from the same warmed-up state (200 epochs
of SGNHT, h = 2e-3, A = 1) and is judged by the strict check (`rtol=0`): every post-burn-in mean,
of the whole net and of each variable with >= 100 scalars, kinetic and configurational, within
the 99% familywise batch-means band of T.

- `HOLDS`: settings that hold T, at T = 1 and at a cold T = 0.3.
- The wrong runs (a chain at T = 2 checked against T = 1; SGHMC with a large step and no noise
  correction) must be flagged: the check can fail.

All are slow (tens of seconds to minutes each); the default suite tests the check itself in
test_equilibration.py. The figures behind the README's table come from
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
    report = nt.run(net, "sgnht", 2.0, epochs=60, check_temperature=1.0, warm_up_epochs=0)
    assert report["equilibrated"] is False, _describe(report)
    assert report["overall"]["configurational"]["in_band"] is False, _describe(report)


def test_sghmc_with_a_large_step_in_heavy_noise_is_flagged():
    report = nt.run("mlp", "sghmc-large-step", 1.0, epochs=100, warm_up_epochs=WARM_UP_EPOCHS)
    assert report["equilibrated"] is False, _describe(report)


# (net, sampler, step size, epochs) that hold T at both temperatures, from the sweep recorded in
# benchmarks/results/network_temperatures_*.json.
HOLDS = [
    ("mlp", "ccadl", 5e-4, 600),
]


@pytest.mark.parametrize("temperature", [1.0, 0.3])
@pytest.mark.parametrize("net, sampler, step_size, epochs", HOLDS)
def test_sampler_holds_its_temperature(net, sampler, step_size, epochs, temperature):
    report = nt.run(net, sampler, temperature, epochs=epochs, step_size=step_size, warm_up_epochs=WARM_UP_EPOCHS)
    assert report["equilibrated"] is True, _describe(report)
