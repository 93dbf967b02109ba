"""The plain warning a run gets when its model learned nothing: one class predicted for nearly every
validation image, or a validation loss no better than a uniform guess's (ln of the number of classes).

A model trained from scratch for too few steps does this (BatchNorm's moving statistics have not settled
in a few dozen steps, so inference-mode outputs are one class), and an accuracy printed alone ("29.7%")
does not say so. Computed from the validation confusion matrix and loss the run already has; no
TensorFlow. `pipelines.local` prints it from metrics.json too.
"""

import math

# One class predicted for at least this share of the validation images, when it is not that common.
ONE_CLASS_SHARE = 0.9
# A validation loss within this fraction of ln(K) is a uniform guess's.
UNIFORM_LOSS_TOLERANCE = 0.05


def learned_nothing_warning(
    confusion_matrix, cross_entropy: float, class_names, *, weights: str | None, steps: int, model: str
) -> str | None:
    """The warning for a model that learned nothing, with the likely cause and what to try; None otherwise.

    `confusion_matrix[true][predicted]` counts the validation images; `weights` is the run's --weights
    (None / "none": from scratch), `steps` how many it trained.
    """
    num_classes = len(class_names)
    total = sum(sum(row) for row in confusion_matrix)
    if num_classes < 2 or total == 0:
        return None
    predicted = [sum(row[column] for row in confusion_matrix) for column in range(num_classes)]
    truth = [sum(row) for row in confusion_matrix]
    top = max(range(num_classes), key=lambda column: predicted[column])
    symptoms = []
    if predicted[top] >= ONE_CLASS_SHARE * total and truth[top] < ONE_CLASS_SHARE * total:
        symptoms.append(
            f"predicts {class_names[top]!r} for {predicted[top]} of the {total} validation images "
            f"({predicted[top] / total:.0%}; {truth[top]} are)"
        )
    uniform = math.log(num_classes)
    if abs(cross_entropy - uniform) <= UNIFORM_LOSS_TOLERANCE * uniform:
        loss = f"validation loss {cross_entropy:.3f} is a uniform guess's (ln {num_classes} = {uniform:.3f})"
        symptoms.append(f"its {loss}" if symptoms else f"'s {loss}")
    if not symptoms:
        return None
    from_scratch = weights in (None, "", "none")
    if from_scratch and model != "small_cnn":
        cause = (
            f"{model} trained from scratch (--weights none) for {steps} steps: too few for it, and its "
            "BatchNorm statistics have not settled, so every image gets about the same output"
        )
        to_try = "--weights imagenet (pretrained), many more steps (--epochs), or --model small_cnn"
    elif from_scratch:
        cause = f"{steps} steps from scratch are too few (or the learning rate is too high or too low)"
        to_try = "more steps (--epochs), pretrained weights (--model mobilenetv3small --weights imagenet)"
    else:
        cause = f"{steps} steps, or a learning rate too high for fine-tuning, or labels that do not match the images"
        to_try = "more steps (--epochs), a lower --learning-rate, and a look at the images per class (preprocess.inspect)"
    said = " and ".join(symptoms)
    said = said if said.startswith("'s ") else f" {said}"  # "the model predicts ...", "the model's loss ..."
    return f"warning: the model{said}: it has learned next to nothing. Likely cause: {cause}. Try {to_try}."
