"""What is trained: the network, where its weights start, and how it is optimized.

models.py        the built-in models (a small CNN and keras.applications backbones) with one head (the entry)
user_model.py    --model module:function: your network with the same input, head and export
pretrained.py    the applications, their input conventions, ImageNet or file weights for the backbone
weights_flag.py  --weights: imagenet, none, or a file, checked before TensorFlow is imported
recipe.py        the optimization numbers: learning rate x batch, warmup, weight decay, EMA; no TensorFlow
lr_scaling.py    how the learning rate follows the batch: linear, or the square root (AdamW)
optimization.py  the Keras optimizer of a recipe: warmup + cosine, decoupled weight decay, EMA
losses.py        the training loss, with label smoothing
freeze.py        --freeze-backbone-epochs: the head alone first, then the whole model
"""
