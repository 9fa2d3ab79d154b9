"""TinyLoop: an inference server for weight-shared looped transformers."""
__version__ = "0.1.0"
