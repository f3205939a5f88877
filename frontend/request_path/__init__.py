"""The request path: a prompt tokenized (tokenizer, chat template) and checked into an engine request
(processor), tracked while the core runs it (request tracker), its outputs detokenized and put together
(detokenizer, output processor) into the public outputs (outputs.py). Kept light: `import frontend` loads
outputs.py from here."""
