"""What is trained: the models, pretrained weights, and the optimization recipe."""
