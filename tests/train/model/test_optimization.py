"""The optimizer and the loss: weight decay on weights only, with a real optimizer step; label smoothing."""

import keras
import numpy as np
import pytest

from train.model import losses, models, optimization, recipe

# In the Python 3.10 leg's subset (scripts/test_py310.sh): the optimizer and schedule under the Keras pinned for 3.10.
pytestmark = pytest.mark.py310

LEARNING_RATE = 0.1
WEIGHT_DECAY = 0.5


def _recipe(optimizer: str) -> recipe.Recipe:
    return recipe.Recipe(
        optimizer=optimizer,
        peak_learning_rate=LEARNING_RATE,
        base_learning_rate=None,
        warmup_steps=0,
        decay_steps=1_000_000,  # the learning rate stays at its peak for the few steps taken here
        weight_decay=WEIGHT_DECAY,
        label_smoothing=0.0,
        ema_momentum=None,
        weights=None,
        freeze_backbone_steps=0,
    )


def _is_norm_or_bias(model, variable) -> bool:
    """By where the variable lives: a normalization layer's, or a bias (independent of the rule under test)."""
    for layer in optimization._nested_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization) and any(variable is v for v in layer.variables):
            return True
    return variable.path.endswith("/bias")


@pytest.mark.parametrize("optimizer", recipe.OPTIMIZERS)
@pytest.mark.parametrize("name", [models.SMALL_CNN, models.MOBILENET_V3_SMALL])
def test_weight_decay_shrinks_weights_and_skips_biases_and_norm_parameters(optimizer, name):
    model = models.build_model(name, (32, 32, 3), 5)
    rng = np.random.default_rng(0)
    for (
        variable
    ) in model.trainable_variables:  # BatchNorm's gamma starts at 1 and beta at 0: make them visible
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    before = {variable.path: variable.numpy().copy() for variable in model.trainable_variables}
    opt = optimization.build_optimizer(_recipe(optimizer), model)
    opt.build(model.trainable_variables)
    # Zero gradients: the gradient step moves nothing (Adam's and SGD's), so all change is the decay.
    opt.apply_gradients([(np.zeros(v.shape, "float32"), v) for v in model.trainable_variables])

    kinds = {"decayed": 0, "kept": 0}
    for variable in model.trainable_variables:
        if _is_norm_or_bias(model, variable):
            np.testing.assert_array_equal(variable.numpy(), before[variable.path], err_msg=variable.path)
            kinds["kept"] += 1
        else:
            expected = before[variable.path] * (1 - LEARNING_RATE * WEIGHT_DECAY)
            np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-5, err_msg=variable.path)
            kinds["decayed"] += 1
    # Both kinds exist in the model (the Dense head's kernel and bias at least; BatchNorm everywhere).
    assert kinds["decayed"] > 1 and kinds["kept"] > 1


def test_no_weight_decay_means_no_decay_pass():
    run = _recipe("sgd")
    run = recipe.Recipe(**{**run.as_dict(), "weight_decay": 0.0})
    model = models.build_model(models.SMALL_CNN, (16, 16, 3), 3)
    assert optimization.build_optimizer(run, model).weight_decay is None


def _smoothed_by_hand(labels, probabilities, smoothing):
    classes = probabilities.shape[1]
    targets = (1 - smoothing) * np.eye(classes)[labels] + smoothing / classes
    return float(np.mean(-np.sum(targets * np.log(probabilities), axis=1)))


def test_label_smoothing_is_cross_entropy_against_smoothed_one_hot_targets():
    labels = np.array([0, 2, 1, 3], np.int32)
    probabilities = np.array(
        [[0.7, 0.1, 0.1, 0.1], [0.05, 0.05, 0.85, 0.05], [0.25, 0.25, 0.25, 0.25], [0.6, 0.2, 0.1, 0.1]],
        np.float32,
    )
    for smoothing in (0.1, 0.3):
        loss = float(losses.training_loss(smoothing)(labels, probabilities))
        assert loss == pytest.approx(_smoothed_by_hand(labels, probabilities, smoothing), rel=1e-5)
        # The same as Keras' categorical loss on one-hot labels.
        one_hot = keras.losses.CategoricalCrossentropy(label_smoothing=smoothing)(
            np.eye(4)[labels], probabilities
        )
        assert loss == pytest.approx(float(one_hot), rel=1e-6)
    # Without smoothing: the plain sparse cross-entropy.
    plain = float(losses.training_loss(0.0)(labels, probabilities))
    assert plain == pytest.approx(_smoothed_by_hand(labels, probabilities, 0.0), rel=1e-5)


def test_label_smoothing_penalizes_confidence_and_leaves_a_uniform_prediction_alone():
    smoothed = losses.training_loss(0.2)
    plain = losses.training_loss(0.0)
    confident = np.array([[0.97, 0.01, 0.01, 0.01]], np.float32)
    uniform = np.full((1, 4), 0.25, np.float32)
    label = np.array([0], np.int32)
    # A confident right answer costs more with smoothing: the targets ask for 0.85, not 1.
    assert float(smoothed(label, confident)) > float(plain(label, confident)) + 0.1
    # The uniform prediction costs log(4) either way.
    assert float(smoothed(label, uniform)) == pytest.approx(np.log(4), rel=1e-5)
    assert float(plain(label, uniform)) == pytest.approx(np.log(4), rel=1e-5)
    # The minimum of the smoothed loss is at the smoothed targets, not at the one-hot.
    target = np.array([[0.85, 0.05, 0.05, 0.05]], np.float32)
    assert float(smoothed(label, target)) < float(smoothed(label, confident))


def test_smoothed_loss_trains_a_model_with_integer_labels_and_keeps_accuracy_right():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        optimizer="sgd",
        loss=losses.training_loss(0.1),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    x = np.eye(4, dtype="float32")[[0, 1, 2, 3, 0, 1]]
    y = np.array([0, 1, 2, 0, 0, 1], np.int32)
    results = model.evaluate(x, y, return_dict=True, verbose=0)
    predicted = model.predict(x, verbose=0).argmax(axis=1)
    assert results["accuracy"] == pytest.approx(np.mean(predicted == y))
    restored = keras.losses.deserialize(keras.losses.serialize(losses.training_loss(0.1)))
    assert restored.label_smoothing == pytest.approx(0.1)
