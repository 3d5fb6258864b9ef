"""tensorwire: move tensors and model updates fast over the protocols people deploy."""
