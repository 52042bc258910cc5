"""Keras' own `fit` arguments with a BayesianModel: what changes the sampled target is refused or
said in plain words, and what Keras users rely on (`validation_split` with the default shuffle)
works."""

from __future__ import annotations

import logging
import pathlib
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import _fit_checks

ROWS = 50


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    return x, rng.integers(0, 2, size=ROWS)


def _model(num_examples=ROWS, sampler=None, layers=()):
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), *layers, keras.layers.Dense(2)])
    model = kt.BayesianModel(net, sampler or kt.samplers.SGHMC(1e-3), num_examples=num_examples, seed=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit_warnings(model, *args, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(*args, verbose=0, **kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_validation_split_with_the_default_shuffle_trains_on_the_first_rows():
    x, y = _data()
    model = _model(num_examples=40)
    found = _fit_warnings(model, x, y, batch_size=10, epochs=1, validation_split=0.2)
    assert not [w for w in found if "num_examples" in w]  # 40 = the rows it trains on
    history = model.fit(x, y, batch_size=10, epochs=1, validation_split=0.2, verbose=0)
    assert "val_loss" in history.history and model.sampler_step == 8  # 2 epochs of 4 steps


def test_num_examples_that_disagrees_with_the_training_rows_warns_with_the_factor():
    x, y = _data()
    found = _fit_warnings(_model(num_examples=ROWS), x, y, batch_size=10, epochs=1, validation_split=0.2)
    assert any("num_examples=50" in w and "trains on 40" in w and "1.25 times" in w for w in found), found
    found = _fit_warnings(_model(num_examples=2 * ROWS), x, y, batch_size=10, epochs=1)
    assert any("2 times" in w for w in found), found


def test_a_pipeline_that_drops_its_last_partial_batch_still_agrees_with_num_examples():
    """N = 50 in batches of 16 with `drop_remainder=True` trains on 48 rows a pass: no warning
    (fewer than a batch left out); N = 70 there is more than a batch off and warns."""
    x, y = _data()
    pipeline = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    assert not [w for w in _fit_warnings(_model(num_examples=ROWS), pipeline, epochs=1) if "num_examples" in w]
    found = _fit_warnings(_model(num_examples=70), pipeline, epochs=1)
    assert any("num_examples=70" in w and "trains on 48" in w for w in found), found


@pytest.mark.parametrize("cut", ["y", "sample_weight"])
def test_arrays_of_different_lengths_are_refused_with_their_sizes_before_any_step(cut):
    x, y = _data()
    arrays = {"x": x, "y": y, "sample_weight": np.ones(len(x), np.float32)}
    arrays[cut] = arrays[cut][:10]
    model = _model()
    with pytest.raises(ValueError, match=rf"same number of examples .*`x` {len(x)}.*`{cut}` 10"):
        model.fit(batch_size=10, epochs=1, verbose=0, **arrays)
    assert not model.built or int(model.sampler_step) == 0


def test_validation_arrays_and_named_inputs_of_different_lengths_are_refused_with_their_names():
    x, y = _data()
    model = _model()
    with pytest.raises(ValueError, match=r"`validation_data`'s arrays must hold the same number.*`x` 10.*`y` 5"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0, validation_data=(x[:10], y[:5]))
    assert not model.built or int(model.sampler_step) == 0  # refused before any step
    inputs = {"a": keras.Input((x.shape[1],), name="a"), "b": keras.Input((x.shape[1],), name="b")}
    net = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Add()([inputs["a"], inputs["b"]])))
    named = kt.BayesianModel(net, kt.samplers.SGLD(1e-3), num_examples=len(x), seed=0)
    named.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=rf"`x\['a'\]` {len(x)}, `x\['b'\]` 7, `y` {len(x)}"):
        named.fit({"a": x, "b": x[:7]}, y, batch_size=10, epochs=1, verbose=0)


def test_num_examples_none_takes_the_training_rows():
    x, y = _data()
    model = _model(num_examples=None)
    with pytest.raises(ValueError, match="num_examples"):
        _ = model.likelihood_weight
    model.fit(x, y, batch_size=10, epochs=1, validation_split=0.2, verbose=0)
    assert model.num_examples == 40 and model.get_config()["num_examples"] == 40
    # It is the default: a user who leaves it out gets the same.
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    default = kt.BayesianModel(net, kt.samplers.SGHMC(1e-3), seed=0)
    default.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    default.fit(x, y, batch_size=10, epochs=1, validation_split=0.2, verbose=0)
    assert default.num_examples == 40


def test_class_weight_warns_that_the_target_is_reweighted():
    x, y = _data()
    found = _fit_warnings(_model(), x, y, batch_size=10, epochs=1, class_weight={0: 1.0, 1: 3.0})
    assert any("class_weight" in w and "not the Bayes posterior" in w for w in found), found


def test_early_stopping_that_restores_weights_warns_that_it_breaks_the_chain():
    x, y = _data()
    stop = keras.callbacks.EarlyStopping(monitor="loss", restore_best_weights=True)
    found = _fit_warnings(_model(), x, y, batch_size=10, epochs=1, callbacks=[stop])
    assert any("restore_best_weights=True" in w and "broken chain" in w for w in found), found
    plain = keras.callbacks.EarlyStopping(monitor="loss")
    assert not _fit_warnings(_model(), x, y, batch_size=10, epochs=1, callbacks=[plain])


def test_dropout_with_ccadl_is_refused_without_naming_a_fallback(caplog):
    x, y = _data()
    model = _model(sampler=kt.samplers.CCAdL(1e-3), layers=[keras.layers.Dropout(0.5)])
    with caplog.at_level(logging.WARNING, logger="keras_thermo"):
        with pytest.raises(ValueError, match="layer 'dropout[_0-9]*'.*Dropout \\(rate=0.5\\)"):
            model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    assert "vectorized_map" not in caplog.text


def test_the_package_imports_no_private_keras_module():
    package = pathlib.Path(kt.__file__).parent
    private = re.compile(r"^\s*(from|import)\s+keras\.src\b|keras\.src\.", re.MULTILINE)
    found = [str(path.relative_to(package)) for path in package.rglob("*.py") if private.search(path.read_text())]
    assert not found, f"private keras.src imports in {found}"


@pytest.mark.parametrize("activation, from_logits, warns", [
    ("softmax", True, True), (None, False, True), ("softmax", False, False), (None, True, False),
])
def test_a_loss_that_reads_the_wrong_kind_of_output_warns(activation, from_logits, warns):
    x, y = _data()
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation=activation)])
    model = kt.BayesianModel(net, kt.samplers.SGHMC(1e-3), num_examples=ROWS, seed=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits))
    found = [w for w in _fit_warnings(model, x, y, batch_size=10, epochs=1) if "from_logits" in w]
    assert bool(found) == warns, found


def _regression_model(loss, units=1):
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
    model = kt.BayesianModel(net, kt.samplers.SGHMC(1e-3), num_examples=ROWS, seed=0)
    model.compile(loss=loss)
    return model


def _check_warnings(check, *args) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(*args)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_mse_warns_once_that_it_is_a_gaussian_of_variance_one_half():
    x, _ = _data()
    y = np.random.default_rng(1).normal(size=(ROWS, 1)).astype("float32")
    model = _regression_model("mse")
    found = _fit_warnings(model, x, y, batch_size=10, epochs=1)
    said = [w for w in found if "loss='mse'" in w]
    assert len(said) == 1 and "variance 1/2" in said[0] and "keras_thermo.losses.GaussianNLL" in said[0], found
    assert not [w for w in _fit_warnings(model, x, y, batch_size=10, epochs=1) if "loss='mse'" in w]  # once
    for loss in [keras.losses.MeanSquaredError(), keras.losses.mean_squared_error, "mean_squared_error"]:
        assert len(_check_warnings(_fit_checks.warn_about_mse_likelihood, _regression_model(loss))) == 1, loss
    assert not _check_warnings(_fit_checks.warn_about_mse_likelihood, _regression_model(kt.losses.GaussianNLL(1.0)))


def _assert_says_how_to_standardise(found):
    assert len(found) == 1, found
    for what in ["mean [", "standard deviation [", "TargetScaler().fit(y_train)", "scaler.transform(y_train)",
                 "scaler=scaler", "scaler.inverse_transform(", "scaler.inverse_transform_std(std)"]:
        assert what in found[0], what


def test_targets_far_from_unit_scale_warn_with_how_to_standardise():
    x, _ = _data()
    y = np.random.default_rng(1).normal(150.0, 70.0, size=(ROWS, 1)).astype("float32")  # diabetes-like
    found = _fit_warnings(_regression_model(kt.losses.GaussianNLL(), units=2), x, y, batch_size=10, epochs=1)
    _assert_says_how_to_standardise([w for w in found if "far from unit scale" in w])
    for loc, scale in [(0.0, 0.01), (40.0, 1.0), (0.0, 30.0)]:  # tiny, offset, wide
        y = np.random.default_rng(1).normal(loc, scale, size=(ROWS, 2))
        model = _regression_model(kt.losses.GaussianNLL(scale=1.0), units=2)
        _assert_says_how_to_standardise(_check_warnings(_fit_checks.warn_about_target_scale, model, y))
        assert not _check_warnings(_fit_checks.warn_about_target_scale, model, y)  # once a model


def test_standardised_targets_and_class_labels_stay_quiet():
    x, _ = _data()
    y = np.random.default_rng(1).normal(150.0, 70.0, size=(ROWS, 1))
    scaler = kt.regression.TargetScaler().fit(y)
    found = _fit_warnings(_regression_model(kt.losses.GaussianNLL(), units=2), x, scaler.transform(y),
                          batch_size=10, epochs=1)
    assert not [w for w in found if "unit scale" in w or "loss='mse'" in w], found
    # Class labels are no regression targets, however many classes (labels up to 49 here).
    assert not _check_warnings(_fit_checks.warn_about_target_scale, _model(), np.arange(ROWS) % 50)
