"""POST /tokenize and POST /detokenize with the served model's tokenizer and chat template."""
