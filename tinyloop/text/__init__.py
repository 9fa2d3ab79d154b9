"""Text: the tokenizer and streaming detokenizer, chat templates, stop strings."""
