"""The model: config, the .tinyloop file, quantized tensors, weights, the looped transformer, loading."""
